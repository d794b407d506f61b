"""Split-KV (flash-decoding) paged attention for decode-only steps, where long contexts meet small batches.

Same contract as `ragged_paged_attention_reference` restricted to max_query_len == 1: every sequence has one query
token (its newest) or none (padding). With one query per sequence the ragged kernel runs only S * Hkv programs, each
walking a whole context, and at small batch most of the GPU idles. Here each context is cut into NS splits of
`split` tokens, every split gets its own program, and a small XLA step merges the partial results.

Grid (S, Hkv, NS). Program (s, h, k) takes the G query heads of KV head h (padded to GP >= 16 rows for Triton dots)
of sequence s's query token and attends to keys [k * split, min((k + 1) * split, context_lens[s])):

    keys of s    |---- split 0 ----|---- split 1 ----|-- split 2 --|         (context_lens[s])
    programs          (s, h, 0)         (s, h, 1)       (s, h, 2)     (s, h, 3) .. : empty, no loads

and writes its softmax-normalized partial output and base-2 log-sum-exp:

    o_part [S, Hkv, NS, GP, D] float32     0 for an empty split
    lse    [S, Hkv, NS, GP]    float32     MASK_VALUE for an empty split

Combine: out[s] = sum_k 2^(lse_k - max_k lse) o_k / sum_k 2^(lse_k - max_k lse), written to token
query_start_loc[s]; tokens that belong to no sequence stay zero. Padded sequences (context 0) cost one empty program
per split.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.paged_attention.common import (SoftmaxState, attend_kv_range, check_shapes, load_kv_tiles,
                                                   load_query_rows, pow2_at_least)
from pallas_kernels.triton_compat import compiler_params

TARGET_PROGRAMS = 1024  # enough programs to fill a Hopper-class GPU (132 SMs) several times over


def split_kv_paged_attention(
    q: jax.Array,  # [T, Hq, D]
    k_pool: jax.Array,  # [L, N, Hkv, B, D]
    v_pool: jax.Array,  # [L, N, Hkv, B, D]
    layer: jax.Array | int,  # scalar
    block_tables: jax.Array,  # [S, MB] int32
    context_lens: jax.Array,  # [S] int32
    query_start_loc: jax.Array,  # [S+1] int32, every q_len 0 or 1
    *,
    max_query_len: int = 1,  # accepted for the reference's signature; must be 1
    sm_scale: float,
    num_splits: int | None = None,  # default: default_num_splits(...)
    block_kv: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
    interpret: bool = False,
) -> jax.Array:  # [T, Hq, D]; tokens of no sequence get zeros
    if max_query_len != 1:
        raise ValueError(f"split-KV attention is for decode-only steps (max_query_len 1), got {max_query_len}")
    check_shapes(q, k_pool, block_kv)
    num_seqs, max_blocks = block_tables.shape
    num_kv_heads, block_size = k_pool.shape[2], k_pool.shape[3]
    max_context = max_blocks * block_size
    num_splits = num_splits or default_num_splits(num_seqs, num_kv_heads, max_context, block_kv)
    split = _cdiv(_cdiv(max_context, num_splits), block_kv) * block_kv  # whole KV tiles per split
    o_part, lse = _partials(q, k_pool, v_pool, layer, block_tables, context_lens, query_start_loc,
                            num_splits=_cdiv(max_context, split), split=split, sm_scale=sm_scale, block_kv=block_kv,
                            num_warps=num_warps, num_stages=num_stages, interpret=interpret)
    return _combine(o_part, lse, query_start_loc, q)


def default_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, block_kv: int) -> int:
    """Enough splits for about TARGET_PROGRAMS programs, but no split shorter than one KV tile."""
    wanted = _cdiv(TARGET_PROGRAMS, num_seqs * num_kv_heads)
    return max(1, min(wanted, _cdiv(max_context, block_kv)))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _partials(q, k_pool, v_pool, layer, block_tables, context_lens, query_start_loc, *, num_splits, split, sm_scale,
              block_kv, num_warps, num_stages, interpret):
    """The split kernel: (o_part [S, Hkv, NS, GP, D], lse [S, Hkv, NS, GP]), both float32."""
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads = k_pool.shape[2]
    num_seqs = block_tables.shape[0]
    group = num_q_heads // num_kv_heads
    gp = max(16, pow2_at_least(group))
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    kernel = functools.partial(_kernel, group=group, gp=gp, split=split, sm_scale=sm_scale, block_kv=block_kv)
    return pl.pallas_call(
        kernel,
        grid=(num_seqs, num_kv_heads, num_splits),
        in_specs=[any_spec] * 7,
        out_specs=[pl.BlockSpec((None, None, None, gp, head_dim), lambda s, h, k: (s, h, k, 0, 0)),
                   pl.BlockSpec((None, None, None, gp), lambda s, h, k: (s, h, k, 0))],
        out_shape=[jax.ShapeDtypeStruct((num_seqs, num_kv_heads, num_splits, gp, head_dim), jnp.float32),
                   jax.ShapeDtypeStruct((num_seqs, num_kv_heads, num_splits, gp), jnp.float32)],
        compiler_params=compiler_params(num_warps, num_stages),
        interpret=interpret,
        name="split_kv_paged_attention",
    )(jnp.asarray(layer, jnp.int32).reshape(1), block_tables, context_lens, query_start_loc, q, k_pool, v_pool)


def _kernel(layer_ref, tables_ref, context_lens_ref, query_start_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *,
            group, gp, split, sm_scale, block_kv):
    seq, kv_head, split_idx = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    token = query_start_ref[seq]
    has_query = query_start_ref[seq + 1] > token
    context = jnp.where(has_query, context_lens_ref[seq], 0)

    g = jnp.arange(gp, dtype=jnp.int32)  # [GP]
    valid = (g < group) & has_query  # [GP]
    q = load_query_rows(q_ref, jnp.full((gp,), token), kv_head * group + g, valid)  # [GP, D]

    kv_start = split_idx * split
    kv_end = jnp.minimum(kv_start + split, context)  # <= kv_start for splits past the context: no steps
    layer = layer_ref[0]
    load_kv = lambda start: load_kv_tiles(k_ref, v_ref, layer, tables_ref, seq, kv_head, start, kv_end, block_kv)
    state = attend_kv_range(q, jnp.full((gp,), context - 1), kv_start, kv_end, load_kv, scale=sm_scale,
                            block_kv=block_kv, state=SoftmaxState.init(gp, q.shape[1]))

    o_ref[...] = state.normalized()
    lse_ref[...] = state.log2_sum_exp2()


def _combine(o_part, lse, query_start_loc, q) -> jax.Array:
    """Merge the splits by their log-sum-exp and scatter each sequence's row to its token -> [T, Hq, D]."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs, num_kv_heads = lse.shape[:2]
    weight = jnp.exp2(lse - lse.max(axis=2, keepdims=True))  # [S, Hkv, NS, GP]; 1 at the max, so the sum is >= 1
    out = (weight[..., None] * o_part).sum(axis=2) / weight.sum(axis=2)[..., None]  # [S, Hkv, GP, D]
    out = out[:, :, :num_q_heads // num_kv_heads].reshape(num_seqs, num_q_heads, head_dim)  # [S, Hq, D]
    has_query = query_start_loc[1:] > query_start_loc[:-1]  # [S]
    dest = jnp.where(has_query, query_start_loc[:-1], num_tokens)  # [S]; padding goes out of range, dropped
    return jnp.zeros_like(q).at[dest].set(out.astype(q.dtype), mode="drop")
