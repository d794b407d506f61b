"""The routed MoE on a CPU: work in proportion to the routes, not to E.

Routes are laid out by expert in tiles (layout.py); a loop over the experts that have routes (a dynamic trip
count, so an idle expert costs nothing) takes that expert's weights once, and an inner loop runs its tiles:

    for e in used_experts[:num_used_experts]:
        w_gate_up[e] [2I, H], w_down[e] [H, I]
        for rows r0 .. r0 + m of e's group:                      x_rows [m, H]
            out_rows[r0 : r0 + m] = down(act(gate) * up)         [m, H] in x's dtype

then `combine` sums each token's routes with their weights. Padding rows are zero inputs whose outputs no route
reads. jax.lax.ragged_dot was measured instead: XLA:CPU expands it densely over the experts (1.3 s at E=64 for 16
routes of H=1024, against milliseconds here), so it is not used.

block_m (rows per tile) defaults to `cpu_block_m`: about the mean group size, so a group is one or two dots.

Up to NATIVE_MAX_TOKENS tokens the native kernel (cpu_kernel.cc via cpu_native.py) runs instead, where it builds
and takes the dtypes: it reads each routed expert in place, where this loop's runtime expert index makes XLA:CPU
copy the expert out of the stack before its dot (benchmarks/RESULTS.md, "MoE experts on CPU").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.moe.awq import expert_weight, num_experts as stack_experts
from pallas_kernels.moe.layout import build_layout, combine, gather_rows, mean_routes_per_expert
from pallas_kernels.moe.cpu_native import moe_experts_native, moe_kernel_error, native_supports
from pallas_kernels.moe.reference import ACTIVATIONS
from pallas_kernels.sizes import pow2_at_least

MAX_CPU_BLOCK_M = 64
NATIVE_MAX_TOKENS = 1024  # measured: the native kernel wins at T = 1 .. 1024, past it unmeasured (benchmarks/RESULTS.md)


def cpu_block_m(num_routes: int, num_experts: int) -> int:
    """Rows per tile: the mean routes per touched expert, as a power of two, at most MAX_CPU_BLOCK_M."""
    return min(MAX_CPU_BLOCK_M, pow2_at_least(mean_routes_per_expert(num_routes, num_experts)))


def moe_experts_cpu(x: jax.Array, expert_ids: jax.Array, expert_weights: jax.Array, w_gate_up: jax.Array,
                    w_down: jax.Array, activation: str = "silu", block_m: int | None = None,
                    native: bool | None = None) -> jax.Array:
    """reference.py's contract, routed: [T, H] -> [T, H] in x.dtype. native: run the native kernel (True), the
    jnp loop (False), or decide by `use_native` (None). The stacks may be AWQ int4 (awq.py): the jnp loop then
    dequantizes each used expert once, before its tiles, and idle experts not at all."""
    num_experts = stack_experts(w_gate_up)
    top_k = expert_ids.shape[1]
    if expert_ids.size == 0:  # no tokens (or k = 0): nothing routed
        return jnp.zeros_like(x)
    if native or (native is None and use_native(x, w_gate_up, w_down)):
        return moe_experts_native(x, expert_ids, expert_weights, w_gate_up, w_down, activation)
    block_m = block_m or cpu_block_m(expert_ids.size, num_experts)
    layout = build_layout(expert_ids, num_experts, block_m)
    x_rows = gather_rows(x, layout, top_k)  # [P, H]

    def expert(i, out_rows):  # out_rows: [P, H]
        e = layout.used_experts[i]
        w_gu, w_d = expert_weight(w_gate_up, e, x.dtype), expert_weight(w_down, e, x.dtype)  # [2I, H], [H, I]
        start = layout.group_start[e]

        def tile(j, out_rows):
            r0 = start + j * block_m
            rows = jax.lax.dynamic_slice_in_dim(x_rows, r0, block_m)  # [m, H]
            return jax.lax.dynamic_update_slice_in_dim(out_rows, expert_mlp(rows, w_gu, w_d, activation), r0, 0)

        num = (layout.group_start[e + 1] - start) // block_m
        return jax.lax.fori_loop(0, num, tile, out_rows)

    out_rows = jax.lax.fori_loop(0, layout.num_used_experts, expert, jnp.zeros_like(x_rows))  # [P, H]
    return combine(out_rows, layout, expert_ids, expert_weights, x.dtype)


def use_native(x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array) -> bool:
    """The static choice: the native kernel for up to NATIVE_MAX_TOKENS tokens, where it builds and takes the
    dtypes (dense stacks only); the jnp loop otherwise."""
    return x.shape[0] <= NATIVE_MAX_TOKENS and native_supports(x, w_gate_up, w_down) and moe_kernel_error() is None


def expert_mlp(x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array, activation: str) -> jax.Array:
    """One expert's gated MLP as the reference rounds it: x [M, H], w_gate_up [2I, H], w_down [H, I] -> [M, H]."""
    dims = (((1,), (1,)), ((), ()))  # x @ w.T
    gate_up = jax.lax.dot_general(x, w_gate_up.astype(x.dtype), dims,
                                  preferred_element_type=jnp.float32).astype(x.dtype)  # [M, 2I]
    gate, up = jnp.split(gate_up, 2, axis=-1)  # [M, I] each
    hidden = ACTIVATIONS[activation](gate) * up
    return jax.lax.dot_general(hidden, w_down.astype(x.dtype), dims,
                               preferred_element_type=jnp.float32).astype(x.dtype)  # [M, H]
