"""Ragged paged attention for NVIDIA GPUs: one Pallas (Triton) launch for a step mixing decode and prefill tokens.

Same contract as `ragged_paged_attention_reference` (see reference.py for the pool layout and the ragged batch).

Query tiles. A tile is TQ consecutive query tokens of one sequence times the G query heads that share one KV head,
laid out as M = TQ * GP rows, row r = (token r // GP, head r % GP). GP is G rounded up to a power of two, and further
until M >= 16, because Triton dots need power-of-two dims >= 16; the padding rows are masked.

Grid. Tiles are numbered back to back over the sequences, and program (b, h) computes tile b for KV head h:

    q_len        3   0   9   1          (T = 13 tokens, TQ = 4; sequence 1 is padding and owns no tile)
    tile_starts  0   1   1   4   5      [S+1] prefix sums of cdiv(q_len, TQ)
    tile_seq     0   2   2   2   3   3  [NT]  owning sequence of each tile; NT = 6 is a static bound, and the
                                              programs of tiles past tile_starts[S] find no query and do nothing

So a long prefill chunk next to many decode tokens costs its own tiles only, not max_query_len / TQ tiles for every
sequence. Each program streams its sequence's KV blocks from key 0 (with a sliding window: from the block_kv tile
holding the first key its first query sees) up to the last key its final query row may see (causal) in tiles of
block_kv tokens, with an online softmax in float32, and stores the valid rows. Soft-capping and the window mask are
static options, compiled away when None. Prefill tiles of heads wider than 128 take 32 keys and 8 warps
(`default_knobs`: at 64 keys they spill on sm_90a). Rows of padding
tokens (past query_start_loc[S]) belong to no tile: the output starts as zeros and the kernel writes into it in place.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.paged_attention.common import (SoftmaxState, attend_kv_range, check_shapes, load_kv_tiles,
                                                   load_query_rows, window_start)
from pallas_kernels.paged_attention.reference import check_attention_options
from pallas_kernels.sizes import pow2_at_least
from pallas_kernels.triton_compat import compiler_params, store


def ragged_paged_attention(
    q: jax.Array,  # [T, Hq, D]
    k_pool: jax.Array,  # [L, N, Hkv, B, D]
    v_pool: jax.Array,  # [L, N, Hkv, B, D]
    layer: jax.Array | int,  # scalar
    block_tables: jax.Array,  # [S, MB] int32
    context_lens: jax.Array,  # [S] int32
    query_start_loc: jax.Array,  # [S+1] int32
    *,
    max_query_len: int,
    sm_scale: float,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
    block_q: int | None = None,  # query tokens per tile; default: 64 rows
    block_kv: int | None = None,  # keys per inner step; default: default_knobs
    num_warps: int | None = None,  # default: default_knobs
    num_stages: int = 2,
    interpret: bool = False,
) -> jax.Array:  # [T, Hq, D]; padding tokens get zeros
    return ragged_paged_attention_into(
        jnp.zeros_like(q), q, k_pool, v_pool, layer, block_tables, context_lens, query_start_loc,
        max_query_len=max_query_len, sm_scale=sm_scale, sliding_window=sliding_window, logit_softcap=logit_softcap,
        block_q=block_q, block_kv=block_kv, num_warps=num_warps,
        num_stages=num_stages, interpret=interpret)


def ragged_paged_attention_into(
    out: jax.Array,  # [T, Hq, D]: rows of tokens that belong to no sequence come back unchanged
    q, k_pool, v_pool, layer, block_tables, context_lens, query_start_loc, *,  # as in ragged_paged_attention
    max_query_len: int,
    sm_scale: float,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
    block_q: int | None = None,
    block_kv: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
    interpret: bool = False,
) -> jax.Array:
    """`ragged_paged_attention` writing into a given buffer (the tests pass a NaN-filled one)."""
    num_tokens, num_q_heads, _ = q.shape
    num_kv_heads = k_pool.shape[2]
    group = num_q_heads // num_kv_heads
    check_attention_options(sliding_window, logit_softcap)
    tq, gp = tile_shape(group, max_query_len, block_q)
    default_block_kv, default_warps = default_knobs(q.shape[2], tq * gp)
    block_kv = default_block_kv if block_kv is None else block_kv
    num_warps = default_warps if num_warps is None else num_warps
    check_shapes(q, k_pool, block_kv)
    tile_seq, tile_starts = _tile_schedule(query_start_loc, tq, num_tokens)

    kernel = functools.partial(_kernel, group=group, tq=tq, gp=gp, sm_scale=sm_scale, block_kv=block_kv,
                               sliding_window=sliding_window, logit_softcap=logit_softcap)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel,
        grid=(tile_seq.shape[0], num_kv_heads),
        in_specs=[any_spec] * 10,
        out_specs=any_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        input_output_aliases={9: 0},
        compiler_params=compiler_params(num_warps, num_stages),
        interpret=interpret,
        name="ragged_paged_attention",
    )(jnp.asarray(layer, jnp.int32).reshape(1), block_tables, context_lens, query_start_loc, tile_seq, tile_starts,
      q, k_pool, v_pool, out)


def tile_shape(group: int, max_query_len: int, block_q: int | None) -> tuple[int, int]:
    """(TQ query tokens per tile, GP padded group): TQ * GP rows, a power of two >= 16."""
    gp = pow2_at_least(group)
    tq = min(pow2_at_least(block_q or 64 // gp), pow2_at_least(max_query_len))
    return tq, max(gp, 16 // tq)


def default_knobs(head_dim: int, rows: int) -> tuple[int, int]:
    """(block_kv, num_warps) for tiles of `rows` query rows: 64 keys and 4 warps, except for prefill tiles (more
    than 16 rows) of heads over 128 wide, whose float32 accumulator and query rows would spill 4 warps' registers
    at 64 keys (sm_90a, head 256, 64 rows: 255 registers and 36 B spilled); 32 keys and 8 warps keep them at about
    170 registers with no spills and 96 KiB of shared memory."""
    if head_dim > 128 and rows > 16:
        return 32, 8
    return 64, 4


def _tile_schedule(query_start_loc: jax.Array, tq: int, num_tokens: int) -> tuple[jax.Array, jax.Array]:
    """(tile_seq [NT], tile_starts [S+1]) as in the module docstring.

    NT bounds sum_s cdiv(q_len[s], TQ) statically: each term is <= q_len[s] and < q_len[s] / TQ + 1 for the at most
    min(S, T) sequences that have tokens.
    """
    num_seqs = query_start_loc.shape[0] - 1
    q_lens = query_start_loc[1:] - query_start_loc[:-1]  # [S]
    tile_starts = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum((q_lens + tq - 1) // tq, dtype=jnp.int32)])
    num_tiles = max(1, min(num_tokens, (num_tokens + min(num_seqs, num_tokens) * (tq - 1)) // tq))
    tiles = jnp.arange(num_tiles, dtype=jnp.int32)
    tile_seq = jnp.searchsorted(tile_starts[1:], tiles, side="right").astype(jnp.int32)
    return jnp.minimum(tile_seq, num_seqs - 1), tile_starts


def _kernel(layer_ref, tables_ref, context_lens_ref, query_start_ref, tile_seq_ref, tile_starts_ref,
            q_ref, k_ref, v_ref, _, o_ref, *, group, tq, gp, sm_scale, block_kv, sliding_window, logit_softcap):
    tile, kv_head = pl.program_id(0), pl.program_id(1)
    seq = tile_seq_ref[tile]
    q_start = query_start_ref[seq]
    q_len = query_start_ref[seq + 1] - q_start
    first = (tile - tile_starts_ref[seq]) * tq  # the tile's first query, counted within the sequence
    cached = context_lens_ref[seq] - q_len  # keys before the sequence's first query

    rows = jnp.arange(tq * gp, dtype=jnp.int32)  # [M]
    t = first + jax.lax.div(rows, gp)  # [M] query index within the sequence
    g = jax.lax.rem(rows, gp)  # [M] query head within the group
    valid = (t < q_len) & (g < group)  # [M]
    heads = kv_head * group + g  # [M]
    q = load_query_rows(q_ref, q_start + t, heads, valid)  # [M, D]

    # Keys kv_start .. kv_end-1: from the first key the tile's first query may see (0 without a window) up to its
    # last valid query; none for tiles past the sequence's queries.
    kv_start = window_start(cached + first, sliding_window, block_kv)
    kv_end = jnp.where(first < q_len, cached + jnp.minimum(first + tq, q_len), 0)
    layer = layer_ref[0]
    load_kv = lambda start: load_kv_tiles(k_ref, v_ref, layer, tables_ref, seq, kv_head, start, kv_end, block_kv)
    state = attend_kv_range(q, cached + t, kv_start, kv_end, load_kv, scale=sm_scale, block_kv=block_kv,
                            state=SoftmaxState.init(tq * gp, q.shape[1]), sliding_window=sliding_window,
                            logit_softcap=logit_softcap)

    # Invalid rows address other sequences' tokens, other KV heads' query heads or nothing: they stay unwritten.
    dims = jnp.arange(o_ref.shape[-1], dtype=jnp.int32)[None, :]  # [1, D]
    index = ((q_start + t)[:, None], heads[:, None], dims)
    store(o_ref.at[index], state.normalized().astype(o_ref.dtype), mask=valid[:, None])
