"""Multi-LoRA delta for NVIDIA GPUs (Pallas, Triton backend): two launches, a split-K shrink then an expand.

Same contract as `lora_delta_reference`: x [T, K], a [S, R, K], b [S, N, R], token_slots [T] int32 (0: no adapter,
s in 1..S: a[s-1], b[s-1]) -> delta [T, N] float32. Tokens are grouped by adapter per tile, in the spirit of Punica's
SGMV: a tile of BM tokens visits only the slots its tokens use (`pl.when` skips the others), so a step whose
requests are contiguous runs of few adapters costs about one adapter per tile; any order of slots is correct.

    shrink  program (i, p): tokens i*BM .. of x, K split p       partials [P, T, R] float32
            for each slot s used by the tile:
                acc = sum over the split's BK steps of x[rows, ks] @ a[s-1, :, ks].T    [BM, RP]
                store acc into the rows of tokens of slot s (rows of no slot get 0)
    expand  program (i, j): tokens i*BM .., columns j*BN ..       delta [T, N] float32
            h = sum_p partials[p, rows, :]  rounded once to b's dtype                   [BM, RP]
            for each slot s used by the tile:
                y = h @ b[s-1, cols, :].T, stored into the rows of tokens of slot s     [BM, BN]
            rows of tokens of no slot get 0

Each token has one slot, so the per-slot stores hit disjoint rows and every row in range is written exactly once:
no accumulator crosses a `pl.when`. RP is R rounded up to a power of two >= 16 (a Triton dot dimension; R = 48, three
fused rank-16 parts, runs as 64): the padded ranks are masked lanes of a and b, read as 0 and never stored. Rows past
T, columns past N and K past the split's end are masked the same way. x loads are also masked to the slot's tokens,
so a token of another slot (or of none) is never read for it: NaN in a base token's row cannot leak.

Splitting K in the shrink gives a decode step (one token tile) enough programs to stream A at bandwidth; the expand
sums the P float32 partials itself before the one rounding, so the whole delta is two launches and no XLA op.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.sizes import pow2_at_least
from pallas_kernels.triton_compat import compiler_params, load, store

KNOBS = frozenset({"block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages"})
TARGET_PROGRAMS = 132  # shrink programs wanted: about one per SM of an H200
MAX_PARTIAL_BYTES = 64 * 1024  # float32 partials one expand program reads, at most (P * BM * RP * 4)


def lora_delta(x: jax.Array, a: jax.Array, b: jax.Array, token_slots: jax.Array, *, interpret: bool = False,
               **knobs) -> jax.Array:
    """-> [T, N] float32: each token's adapter delta b[s-1] @ (a[s-1] @ x[t]), 0 for slot 0 (see module docstring).

    knobs: block_m (tokens per tile, shrunk to T rounded up to a power of two; default 64), block_n (expand columns,
    128), block_k (shrink depth per step, 128), split_k (shrink K splits; None: `default_split_k`), num_warps (4),
    num_stages (2). Unknown knobs are a TypeError.
    """
    unknown = set(knobs) - KNOBS
    if unknown:
        raise TypeError(f"unknown lora_delta knobs {sorted(unknown)}")
    _check_inputs(x, a, b, token_slots)
    tiles = Tiles.choose(x.shape[0], a.shape[1], **{k: v for k, v in knobs.items()
                                                    if k in ("block_m", "block_n", "block_k")})
    launch = dict(num_warps=knobs.get("num_warps", 4), num_stages=knobs.get("num_stages", 2), interpret=interpret)
    num_tokens, k = x.shape
    num_slots, rank, _ = a.shape
    n = b.shape[1]
    if 0 in (num_tokens, k, num_slots, rank, n):
        return jnp.zeros((num_tokens, n), jnp.float32)
    split_k = knobs.get("split_k") or default_split_k(num_tokens, k, rank, tiles)
    splits = _num_splits(k, split_k, tiles.block_k)
    token_slots = token_slots.astype(jnp.int32)
    partials = _shrink_call(x, a, token_slots, None, tiles, splits=splits, **launch)  # [P, T, R]
    return _expand_call(partials, b, token_slots, None, tiles, **launch)  # [T, N]


class Tiles(NamedTuple):
    """The tile sizes of both kernels: BM tokens, BN expand columns, BK shrink depth, RP padded rank."""

    block_m: int
    block_n: int
    block_k: int
    rank_pad: int

    @staticmethod
    def choose(num_tokens: int, rank: int, *, block_m: int = 64, block_n: int = 128,
               block_k: int = 128) -> "Tiles":
        """Validated knobs; BM shrinks to T rounded up to a power of two (at least 16)."""
        for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16 (a Triton dot dimension), got {value}")
        return Tiles(max(16, min(block_m, pow2_at_least(num_tokens))), block_n, block_k,
                     max(16, pow2_at_least(rank)))


def default_split_k(num_tokens: int, k: int, rank: int, tiles: Tiles) -> int:
    """Shrink K splits: about TARGET_PROGRAMS shrink programs, at least one BK step per split, and at most
    MAX_PARTIAL_BYTES of float32 partials per expand program. Unmeasured on a GPU."""
    token_tiles = pl.cdiv(num_tokens, tiles.block_m)
    wanted = pl.cdiv(TARGET_PROGRAMS, token_tiles)
    cap = max(1, MAX_PARTIAL_BYTES // (4 * tiles.block_m * tiles.rank_pad))
    return max(1, min(wanted, cap, pl.cdiv(k, tiles.block_k)))


def lora_shrink_into(partials: jax.Array, x: jax.Array, a: jax.Array, token_slots: jax.Array, *, block_m: int = 64,
                     block_k: int = 128, num_warps: int = 4, num_stages: int = 2,
                     interpret: bool = False) -> jax.Array:
    """The shrink kernel writing into `partials` [P, T, R] float32 in place (the tests pass a NaN-filled buffer:
    every element must come back written). partials[p, t] = the K split p of a[s-1] @ x[t], 0 for no slot."""
    tiles = Tiles.choose(x.shape[0], a.shape[1], block_m=block_m, block_k=block_k)
    if _num_splits(x.shape[1], partials.shape[0], block_k) != partials.shape[0]:
        raise ValueError(f"K = {x.shape[1]} in steps of {block_k} has no {partials.shape[0]} non-empty splits")
    return _shrink_call(x, a, token_slots.astype(jnp.int32), partials, tiles, splits=partials.shape[0],
                        num_warps=num_warps, num_stages=num_stages, interpret=interpret)


def lora_expand_into(out: jax.Array, partials: jax.Array, b: jax.Array, token_slots: jax.Array, *,
                     block_m: int = 64, block_n: int = 128, num_warps: int = 4, num_stages: int = 2,
                     interpret: bool = False) -> jax.Array:
    """The expand kernel writing into `out` [T, N] float32 in place (the tests pass a NaN-filled buffer).
    partials: [P, T, R] float32 as the shrink writes them."""
    tiles = Tiles.choose(out.shape[0], b.shape[2], block_m=block_m, block_n=block_n)
    return _expand_call(partials, b, token_slots.astype(jnp.int32), out, tiles, num_warps=num_warps,
                        num_stages=num_stages, interpret=interpret)


# ---------------------------------------------------------------------------------------------------- shrink


def _shrink_call(x, a, token_slots, out, tiles: Tiles, *, splits, num_warps, num_stages, interpret):
    """One pallas_call over (token tiles, K splits) -> partials [P, T, R] float32, into `out` when given."""
    num_tokens, k = x.shape
    rank = a.shape[1]
    split_len = pl.cdiv(pl.cdiv(k, splits), tiles.block_k) * tiles.block_k  # whole BK steps per split
    kernel = functools.partial(_shrink_kernel, tiles=tiles, split_len=split_len)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    args = (x, a, token_slots) + ((out,) if out is not None else ())
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(num_tokens, tiles.block_m), splits),
        in_specs=[any_spec] * len(args),
        out_specs=any_spec,
        out_shape=jax.ShapeDtypeStruct((splits, num_tokens, rank), jnp.float32),
        input_output_aliases={3: 0} if out is not None else {},
        compiler_params=compiler_params(num_warps, num_stages),
        interpret=interpret,
        name="lora_shrink",
    )(*args)


def _shrink_kernel(x_ref, a_ref, slots_ref, *refs, tiles: Tiles, split_len: int):
    """Program (i, p): partials[p, rows] = x[rows, split p] @ a[slot - 1, :, split p].T per slot (module docstring)."""
    o_ref = refs[-1]  # refs: (aliased input, output) or (output,)
    (num_tokens, k), (num_slots, rank, _) = x_ref.shape, a_ref.shape
    bm, bk = tiles.block_m, tiles.block_k
    rows = pl.program_id(0) * bm + jnp.arange(bm, dtype=jnp.int32)  # [BM]
    split = pl.program_id(1)
    ranks = jnp.arange(tiles.rank_pad, dtype=jnp.int32)  # [RP]
    row_ok, rank_ok = rows < num_tokens, ranks < rank  # [BM], [RP]
    slots = load(slots_ref.at[rows], mask=row_ok, other=0)  # [BM] int32
    first = split * split_len
    end = jnp.minimum(first + split_len, k)
    out_at = o_ref.at[split, rows[:, None], ranks[None, :]]  # [BM, RP] lanes

    def shrink(slot, mine):  # mine: [BM] the tile's tokens of this slot -> [BM, RP] float32
        def step(i, acc):  # acc: [BM, RP]
            ks = first + i * bk + jnp.arange(bk, dtype=jnp.int32)  # [BK]
            k_ok = ks < end
            xt = load(x_ref.at[rows[:, None], ks[None, :]], mask=mine[:, None] & k_ok[None, :], other=0)  # [BM, BK]
            at = load(a_ref.at[slot - 1, ranks[:, None], ks[None, :]], mask=rank_ok[:, None] & k_ok[None, :],
                      other=0).astype(xt.dtype)  # [RP, BK]
            return acc + jax.lax.dot_general(xt, at, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)

        num_steps = jax.lax.div(jnp.maximum(end - first, 0) + bk - 1, bk)
        return jax.lax.fori_loop(0, num_steps, step, jnp.zeros((bm, tiles.rank_pad), jnp.float32))

    _for_each_slot(slots, row_ok, num_slots, out_at, rank_ok, shrink)


# ---------------------------------------------------------------------------------------------------- expand


def _expand_call(partials, b, token_slots, out, tiles: Tiles, *, num_warps, num_stages, interpret):
    """One pallas_call over (token tiles, N tiles) -> delta [T, N] float32, into `out` when given."""
    _, num_tokens, _ = partials.shape
    n = b.shape[1]
    kernel = functools.partial(_expand_kernel, tiles=tiles)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    args = (partials, b, token_slots) + ((out,) if out is not None else ())
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(num_tokens, tiles.block_m), pl.cdiv(n, tiles.block_n)),
        in_specs=[any_spec] * len(args),
        out_specs=any_spec,
        out_shape=jax.ShapeDtypeStruct((num_tokens, n), jnp.float32),
        input_output_aliases={3: 0} if out is not None else {},
        compiler_params=compiler_params(num_warps, num_stages),
        interpret=interpret,
        name="lora_expand",
    )(*args)


def _expand_kernel(partials_ref, b_ref, slots_ref, *refs, tiles: Tiles):
    """Program (i, j): delta[rows, cols] = round(sum_p partials[p, rows]) @ b[slot - 1, cols].T per slot."""
    o_ref = refs[-1]
    (splits, num_tokens, rank), (num_slots, n, _) = partials_ref.shape, b_ref.shape
    bm, bn = tiles.block_m, tiles.block_n
    rows = pl.program_id(0) * bm + jnp.arange(bm, dtype=jnp.int32)  # [BM]
    cols = pl.program_id(1) * bn + jnp.arange(bn, dtype=jnp.int32)  # [BN]
    ranks = jnp.arange(tiles.rank_pad, dtype=jnp.int32)  # [RP]
    row_ok, col_ok, rank_ok = rows < num_tokens, cols < n, ranks < rank
    slots = load(slots_ref.at[rows], mask=row_ok, other=0)  # [BM] int32

    h_mask = row_ok[:, None] & rank_ok[None, :]  # [BM, RP]
    add_split = lambda p, h: h + load(partials_ref.at[p, rows[:, None], ranks[None, :]], mask=h_mask, other=0)
    h = jax.lax.fori_loop(0, splits, add_split, jnp.zeros((bm, tiles.rank_pad), jnp.float32))  # [BM, RP]
    h = h.astype(b_ref.dtype)  # the one rounding of the shrink

    def expand(slot, mine):  # -> [BM, BN] float32 (rows of other slots are computed, never stored)
        del mine
        bt = load(b_ref.at[slot - 1, cols[:, None], ranks[None, :]], mask=col_ok[:, None] & rank_ok[None, :],
                  other=0)  # [BN, RP]
        return jax.lax.dot_general(h, bt, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)

    _for_each_slot(slots, row_ok, num_slots, o_ref.at[rows[:, None], cols[None, :]], col_ok, expand)


# ---------------------------------------------------------------------------------------------------- shared


def _for_each_slot(slots, row_ok, num_slots: int, out_at, col_ok, compute) -> None:
    """Store 0 into the rows of tokens with no adapter, then compute(slot, mine) [BM, C] into the rows of each slot
    the tile uses, skipping the slots it does not: every row of the tile in range is stored exactly once.

    slots, row_ok: [BM]; out_at: the [BM, C] output lanes; col_ok: [C] which of them exist.
    """
    none = row_ok & ((slots < 1) | (slots > num_slots))  # [BM]; out-of-range slots count as none, as in the reference
    store(out_at, jnp.zeros((slots.shape[0], col_ok.shape[0]), jnp.float32), mask=none[:, None] & col_ok[None, :])

    def visit(i, carry):
        slot = i + 1
        mine = row_ok & (slots == slot)  # [BM]

        @pl.when(jnp.sum(mine.astype(jnp.int32)) > 0)
        def _():
            store(out_at, compute(slot, mine), mask=mine[:, None] & col_ok[None, :])

        return carry

    jax.lax.fori_loop(0, num_slots, visit, 0)


def _num_splits(k: int, split_k: int, block_k: int) -> int:
    """Non-empty splits once each of the split_k pieces of K is rounded up to whole BK steps."""
    split_len = pl.cdiv(pl.cdiv(k, max(split_k, 1)), block_k) * block_k
    return pl.cdiv(k, split_len)


def _check_inputs(x, a, b, token_slots) -> None:
    """x [T, K], a [S, R, K], b [S, N, R], token_slots [T] integer, or a ValueError."""
    if x.ndim != 2 or a.ndim != 3 or b.ndim != 3 or token_slots.ndim != 1:
        raise ValueError(f"want x [T, K], a [S, R, K], b [S, N, R], token_slots [T]; got {x.shape}, {a.shape}, "
                         f"{b.shape}, {token_slots.shape}")
    (num_tokens, k), (num_slots, rank, a_k) = x.shape, a.shape
    if a_k != k or b.shape[0] != num_slots or b.shape[2] != rank or token_slots.shape[0] != num_tokens:
        raise ValueError(f"mismatched shapes x {x.shape}, a {a.shape}, b {b.shape}, token_slots {token_slots.shape}")
    if not jnp.issubdtype(token_slots.dtype, jnp.integer):
        raise ValueError(f"token_slots must be integers, got {token_slots.dtype}")
