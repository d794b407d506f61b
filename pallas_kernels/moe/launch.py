"""What the routed MoE's launches share (kernel.py's dense ones, awq_kernel.py's int4 ones): the pallas_call over
operands left in memory, and each launch's cost estimate for the static capacity of P padded rows."""

from __future__ import annotations

from jax.experimental import pallas as pl

from pallas_kernels.triton_compat import compiler_params


def gate_up_cost(rows: int, hidden: int, inter: int, num_tiles: int, itemsize: int) -> pl.CostEstimate:
    """The gate_up launch over `rows` padded rows: its dots, one activation per hidden element, and its bytes
    (x rows in, each tile's expert block of w_gate_up, hidden out)."""
    return pl.CostEstimate(flops=2 * rows * hidden * 2 * inter, transcendentals=rows * inter,
                           bytes_accessed=itemsize * (rows * hidden + num_tiles * 2 * inter * hidden + rows * inter))


def down_cost(rows: int, hidden: int, inter: int, num_tiles: int, itemsize: int) -> pl.CostEstimate:
    """The down launch over `rows` padded rows: its dots and bytes (hidden in, each tile's w_down block, rows out)."""
    return pl.CostEstimate(flops=2 * rows * inter * hidden, transcendentals=0,
                           bytes_accessed=itemsize * (rows * inter + num_tiles * hidden * inter + rows * hidden))


def launch(kernel, args, grid, out_shape, name, cost, num_warps, num_stages, interpret):
    """One pallas_call over `grid`, every operand and the output left in memory (the kernels index them)."""
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(kernel, grid=grid, in_specs=[any_spec] * len(args), out_specs=any_spec,
                          out_shape=out_shape, compiler_params=compiler_params(num_warps, num_stages),
                          cost_estimate=cost, interpret=interpret, name=name)(*args)
