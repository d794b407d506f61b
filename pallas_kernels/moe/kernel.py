"""The routed MoE for NVIDIA GPUs (Pallas, Triton backend): two grouped matmuls over the routed layout.

Same contract as `moe_experts_reference`. layout.py sorts the step's routes by expert into tiles of BM rows, each
tile of one expert (tile_expert); then

    gate_up  program (i, j): tile i's rows, intermediate columns j*BN ..          hidden [P, I] in x's dtype
             e = tile_expert[i]; tok = the tile's rows' tokens (T for padding: masked, read as 0)
             gate = sum over H in BK steps of x[tok, ks] @ w_gate_up[e, cols, ks].T          [BM, BN] float32
             up   = the same with rows I + cols
             hidden[rows, cols] = act(round(gate)) * round(up), rounded to x's dtype
    down     program (i, j): tile i's rows, hidden columns j*BN ..                out_rows [P, H] in x's dtype
             out_rows[rows, cols] = round(sum over I in BK steps of hidden[rows, ks] @ w_down[e, cols, ks].T)

and `combine` (XLA) sums each token's k routed rows with its weights in float32. An AWQ int4 stack (awq.py) takes
awq_kernel.py's launch of the same shape, its weight tiles dequantized in registers. The x rows are gathered by token
inside the gate_up kernel (no [P, H] copy). A tile past the used rows (tile_expert == E) stores zeros and reads no
weights; padding rows inside a used tile compute 0 and no route reads them. Rows are never out of range (P is a
multiple of BM); columns past I or H and K past its end are masked lanes. The tile index is the fastest grid axis,
so the programs running together on one expert's tiles share its weight block in L2.

Cost: each pallas_call passes a `pl.CostEstimate` (`gate_up_cost`, `down_cost`) for the static capacity of
P = num_tiles * BM rows (the routing is data, so the compiler cannot know the used rows): gate_up 2*P*H*2I flops,
down 2*P*I*H. jax's Triton lowering (0.10 and 0.11) drops the estimate, so XLA's cost analysis of a GPU program
does not count these kernels; the estimate is what TPU/Mosaic lowerings and a reader of the jaxpr see.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.moe.awq import is_packed, num_experts as stack_experts
from pallas_kernels.moe.awq_kernel import MIN_BLOCK_K, down_call_awq, gate_up_call_awq
from pallas_kernels.moe.launch import down_cost, gate_up_cost, launch
from pallas_kernels.moe.layout import build_layout, combine, mean_routes_per_expert
from pallas_kernels.moe.reference import ACTIVATIONS
from pallas_kernels.sizes import pow2_at_least
from pallas_kernels.triton_compat import load, store

KNOBS = frozenset({"block_m", "block_n", "block_k", "num_warps", "num_stages"})


def pallas_block_m(num_routes: int, num_experts: int) -> int:
    """Rows per tile: the mean routes per touched expert as a power of two, within 16 (a Triton dot dimension)
    and 64."""
    return min(64, max(16, pow2_at_least(mean_routes_per_expert(num_routes, num_experts))))


def moe_experts_pallas(x: jax.Array, expert_ids: jax.Array, expert_weights: jax.Array, w_gate_up, w_down,
                       activation: str = "silu", *, interpret: bool = False, **knobs) -> jax.Array:
    """reference.py's contract: [T, H] -> [T, H] in x.dtype. Either stack dense or AWQ int4 (awq.py; its launch is
    awq_kernel.py's). knobs: block_m (None: `pallas_block_m`), block_n (64), block_k (64; with an int4 stack 128,
    at least MIN_BLOCK_K), num_warps (4), num_stages (2); all block sizes powers of two >= 16."""
    unknown = set(knobs) - KNOBS
    if unknown:
        raise TypeError(f"unknown moe knobs {sorted(unknown)}")
    num_experts, top_k = stack_experts(w_gate_up), expert_ids.shape[1]
    if expert_ids.size == 0:  # no tokens (or k = 0): nothing routed
        return jnp.zeros_like(x)
    int4 = is_packed(w_gate_up) or is_packed(w_down)
    block_m = knobs.get("block_m") or pallas_block_m(expert_ids.size, num_experts)
    tiles = dict(block_m=block_m, block_n=knobs.get("block_n", 64),
                 block_k=knobs.get("block_k", MIN_BLOCK_K if int4 else 64))
    _check(tiles, int4)
    launch = dict(num_warps=knobs.get("num_warps", 4), num_stages=knobs.get("num_stages", 2), interpret=interpret)
    layout = build_layout(expert_ids, num_experts, block_m)
    row_token = layout.row_route // top_k  # [P]: each row's token, T for padding
    gate_up = gate_up_call_awq if is_packed(w_gate_up) else gate_up_call
    hidden = gate_up(x, row_token, layout.tile_expert, w_gate_up, activation, **tiles, **launch)  # [P, I]
    down = down_call_awq if is_packed(w_down) else down_call
    out_rows = down(hidden, layout.tile_expert, w_down, **tiles, **launch)  # [P, H]
    return combine(out_rows, layout, expert_ids, expert_weights, x.dtype)


def gate_up_call(x, row_token, tile_expert, w_gate_up, activation, *, block_m, block_n, block_k, num_warps,
                 num_stages, interpret):
    """x [T, H], row_token [P], tile_expert [NT], w_gate_up [E, 2I, H] -> hidden [P, I] in x's dtype."""
    rows, num_tiles, (_, two_inter, hidden) = row_token.shape[0], tile_expert.shape[0], w_gate_up.shape
    inter = two_inter // 2
    kernel = functools.partial(_gate_up_kernel, block_m=block_m, block_n=block_n, block_k=block_k,
                               act=ACTIVATIONS[activation])
    return launch(kernel, (x, row_token, tile_expert, w_gate_up), (num_tiles, pl.cdiv(inter, block_n)),
                   jax.ShapeDtypeStruct((rows, inter), x.dtype), "moe_gate_up",
                   gate_up_cost(rows, hidden, inter, num_tiles, x.dtype.itemsize), num_warps, num_stages, interpret)


def down_call(hidden_rows, tile_expert, w_down, *, block_m, block_n, block_k, num_warps, num_stages, interpret):
    """hidden [P, I], tile_expert [NT], w_down [E, H, I] -> out_rows [P, H] in hidden's dtype."""
    (rows, inter), num_tiles, hidden = hidden_rows.shape, tile_expert.shape[0], w_down.shape[1]
    kernel = functools.partial(_down_kernel, block_m=block_m, block_n=block_n, block_k=block_k)
    return launch(kernel, (hidden_rows, tile_expert, w_down), (num_tiles, pl.cdiv(hidden, block_n)),
                   jax.ShapeDtypeStruct((rows, hidden), hidden_rows.dtype), "moe_down",
                   down_cost(rows, hidden, inter, num_tiles, hidden_rows.dtype.itemsize), num_warps, num_stages,
                   interpret)


def _gate_up_kernel(x_ref, token_ref, expert_ref, w_ref, o_ref, *, block_m, block_n, block_k, act):
    """Program (i, j): hidden[tile i rows, cols j] = act(gate) * up of the tile's expert (module docstring)."""
    (num_tokens, hidden), (num_experts, two_inter, _) = x_ref.shape, w_ref.shape
    inter = two_inter // 2
    rows = pl.program_id(0) * block_m + jnp.arange(block_m, dtype=jnp.int32)  # [BM]
    cols = pl.program_id(1) * block_n + jnp.arange(block_n, dtype=jnp.int32)  # [BN]
    col_ok = cols < inter  # [BN]
    expert = load(expert_ref.at[pl.program_id(0)])  # []
    out_at = o_ref.at[rows[:, None], cols[None, :]]  # [BM, BN] lanes

    @pl.when(expert < num_experts)
    def _():
        tokens = load(token_ref.at[rows])  # [BM]
        row_ok = tokens < num_tokens

        def step(s, accs):  # accs: gate, up [BM, BN] float32
            ks = s * block_k + jnp.arange(block_k, dtype=jnp.int32)  # [BK]
            k_ok = ks < hidden
            xt = load(x_ref.at[tokens[:, None], ks[None, :]], mask=row_ok[:, None] & k_ok[None, :], other=0)
            w_mask = col_ok[:, None] & k_ok[None, :]  # [BN, BK]
            wg = load(w_ref.at[expert, cols[:, None], ks[None, :]], mask=w_mask, other=0)  # [BN, BK]
            wu = load(w_ref.at[expert, (inter + cols)[:, None], ks[None, :]], mask=w_mask, other=0)
            return accs[0] + _dot_t(xt, wg), accs[1] + _dot_t(xt, wu)

        zero = jnp.zeros((block_m, block_n), jnp.float32)
        gate, up = jax.lax.fori_loop(0, pl.cdiv(hidden, block_k), step, (zero, zero))
        dtype = o_ref.dtype  # x's: round as the reference does, then the activation in float32
        gate, up = gate.astype(dtype).astype(jnp.float32), up.astype(dtype).astype(jnp.float32)
        store(out_at, (act(gate) * up).astype(dtype), mask=col_ok[None, :])

    @pl.when(expert >= num_experts)
    def _():
        store(out_at, jnp.zeros((block_m, block_n), o_ref.dtype), mask=col_ok[None, :])


def _down_kernel(h_ref, expert_ref, w_ref, o_ref, *, block_m, block_n, block_k):
    """Program (i, j): out_rows[tile i rows, cols j] = hidden[rows] @ w_down[e, cols].T, rounded."""
    inter, (num_experts, hidden, _) = h_ref.shape[1], w_ref.shape
    rows = pl.program_id(0) * block_m + jnp.arange(block_m, dtype=jnp.int32)  # [BM]
    cols = pl.program_id(1) * block_n + jnp.arange(block_n, dtype=jnp.int32)  # [BN]
    col_ok = cols < hidden  # [BN]
    expert = load(expert_ref.at[pl.program_id(0)])  # []
    out_at = o_ref.at[rows[:, None], cols[None, :]]  # [BM, BN] lanes

    @pl.when(expert < num_experts)
    def _():
        def step(s, acc):  # acc: [BM, BN] float32
            ks = s * block_k + jnp.arange(block_k, dtype=jnp.int32)  # [BK]
            k_ok = ks < inter
            ht = load(h_ref.at[rows[:, None], ks[None, :]], mask=k_ok[None, :], other=0)  # [BM, BK]
            wd = load(w_ref.at[expert, cols[:, None], ks[None, :]], mask=col_ok[:, None] & k_ok[None, :], other=0)
            return acc + _dot_t(ht, wd)

        acc = jax.lax.fori_loop(0, pl.cdiv(inter, block_k), step, jnp.zeros((block_m, block_n), jnp.float32))
        store(out_at, acc.astype(o_ref.dtype), mask=col_ok[None, :])

    @pl.when(expert >= num_experts)
    def _():
        store(out_at, jnp.zeros((block_m, block_n), o_ref.dtype), mask=col_ok[None, :])


def _dot_t(a, b):
    """a [M, K] @ b [N, K].T -> [M, N] float32."""
    return jax.lax.dot_general(a, b.astype(a.dtype), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _check(tiles: dict, int4: bool = False) -> None:
    for name, value in tiles.items():
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (a Triton dot dimension), got {value}")
    if int4 and tiles["block_k"] < MIN_BLOCK_K:
        raise ValueError(f"block_k must be >= {MIN_BLOCK_K} with an AWQ int4 expert stack (its BK / 8 word rows "
                         f"are a dot's depth), got {tiles['block_k']}")
