"""Split-KV (flash-decoding) paged attention for decode-only steps, where long contexts meet small batches.

Same contract as `ragged_paged_attention_reference` restricted to max_query_len == 1: every sequence has one query
token (its newest) or none (padding). With one query per sequence the ragged kernel runs only S * Hkv programs, each
walking a whole context, and at small batch most of the GPU idles. Here each context is cut into NS splits of
`split` tokens, every split gets its own program, and a small XLA step merges the partial results.

Grid (S, Hkv, NS). Program (s, h, k) takes the G query heads of KV head h of sequence s's query token (computed as
GP >= 16 rows, G padded for Triton dots) and attends to keys [k * split, min((k + 1) * split, context_lens[s])):

    keys of s    |---- split 0 ----|---- split 1 ----|-- split 2 --|         (context_lens[s])
    programs          (s, h, 0)         (s, h, 1)       (s, h, 2)     (s, h, 3) .. : empty, no loads

With a sliding window the splits cut the window instead (from the block_kv tile holding the query's first visible
key, `_keys_per_query`), so a windowed decode costs its window whatever the context. Each program stores, for the
G real rows only (masked stores; the GP - G padding rows never reach memory), its
softmax-normalized partial output and base-2 log-sum-exp:

    o_part [S, Hkv, NS, G, D] float32     0 for an empty split
    lse    [S, Hkv, NS, G]    float32     MASK_VALUE for an empty split

Combine: out[s] = sum_k 2^(lse_k - max_k lse) o_k / sum_k 2^(lse_k - max_k lse), written to token
query_start_loc[s]; tokens that belong to no sequence stay zero. Padded sequences (context 0) cost one empty program
per split.

Splits (`split_plan`, `default_num_splits`): few and long. Each split's partial costs G * (D + 1) * 4 bytes stored
and as many read back by the merge, against split * D * itemsize * 2 bytes of K and V; splits of at least
MIN_SPLIT_KEYS keys keep that below 4 * G * (D + 1) / (MIN_SPLIT_KEYS * D * itemsize) of the K/V bytes for contexts
that fill the block table (3% for Llama-3-8B in bf16, 6% for 70B), and the number of splits brings the grid nearest
TARGET_PROGRAMS programs (a few per SM of an H200), no further. With one split the merge is skipped.
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

NUM_SMS = 132  # an H200
TARGET_PROGRAMS = 4 * NUM_SMS  # a few resident programs per SM (5 fit at the defaults), all in one wave
MIN_SPLIT_KEYS = 256  # 4 KV tiles at the default block_kv: each split's partial stays small next to its K/V


def split_kv_paged_attention(
    q: jax.Array,  # [T, Hq, D]
    k_pool: jax.Array,  # [L, N, Hkv, B, D]
    v_pool: jax.Array,  # [L, N, Hkv, B, D]
    layer: jax.Array | int,  # scalar: a Python int or a traced int32
    block_tables: jax.Array,  # [S, MB] int32
    context_lens: jax.Array,  # [S] int32
    query_start_loc: jax.Array,  # [S+1] int32, every q_len 0 or 1
    *,
    max_query_len: int = 1,  # accepted for the reference's signature; must be 1
    sm_scale: float,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
    num_splits: int | None = None,  # default: default_num_splits(...)
    block_kv: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
    interpret: bool = False,
) -> jax.Array:  # [T, Hq, D]; tokens of no sequence get zeros
    if max_query_len != 1:
        raise ValueError(f"split-KV attention is for decode-only steps (max_query_len 1), got {max_query_len}")
    check_shapes(q, k_pool, block_kv)
    check_attention_options(sliding_window, logit_softcap)
    num_seqs, max_blocks = block_tables.shape
    num_kv_heads, block_size = k_pool.shape[2], k_pool.shape[3]
    num_splits, split = split_plan(num_seqs, num_kv_heads, _keys_per_query(max_blocks * block_size, sliding_window,
                                                                           block_kv), block_kv, num_splits)
    o_part, lse = _partials(q, k_pool, v_pool, layer, block_tables, context_lens, query_start_loc,
                            num_splits=num_splits, split=split, sm_scale=sm_scale, block_kv=block_kv,
                            sliding_window=sliding_window, logit_softcap=logit_softcap,
                            num_warps=num_warps, num_stages=num_stages, interpret=interpret)
    return _combine(o_part, lse, query_start_loc, q)


def _keys_per_query(max_context: int, sliding_window: int | None, block_kv: int) -> int:
    """The most keys one decode query's splits must cover: its context, or at most its window rounded out to
    whole KV tiles on both sides (the window's first tile starts at a tile boundary)."""
    if sliding_window is None:
        return max_context
    return min(max_context, (pl.cdiv(sliding_window, block_kv) + 1) * block_kv)


def default_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, block_kv: int) -> int:
    """Splits per context: as many as bring the grid nearest TARGET_PROGRAMS programs, but none shorter than
    MIN_SPLIT_KEYS keys (or one KV tile, if that is longer).

    Why both bounds: the kernel is bound by the K/V bytes it reads, so it wants enough programs in flight to keep
    every SM loading (a few per SM; more only add programs that each pay a prologue, a pipeline fill and a partial).
    Each split also writes a float32 partial of G * (D + 1) values that the merge reads back; per KV tile of keys that
    is a fixed cost, so short splits make the partials rival the K/V reads (at 64 keys, G 4 and GP 16 padding rows
    they were half the K/V bytes). With splits of >= MIN_SPLIT_KEYS keys the partials stay under
    4 * G * (D + 1) / (MIN_SPLIT_KEYS * D * itemsize) of the K/V bytes. When the two bounds meet (batch 1: Llama-3's
    8 KV heads x 8192 keys make only 256 splits of 256 keys) the split length wins: about 2 programs per SM.
    A batch with S * Hkv > 2/3 TARGET_PROGRAMS is not split at all: its programs already give every SM a few, all
    resident at once, and doubling them would add a second wave and the merge.
    """
    programs = num_seqs * num_kv_heads
    fill = (TARGET_PROGRAMS + programs // 2) // programs  # nearest TARGET_PROGRAMS / programs
    longest = max_context // max(MIN_SPLIT_KEYS, block_kv)  # splits that are all at least that long
    return max(1, min(fill, longest))


def split_plan(num_seqs: int, num_kv_heads: int, max_context: int, block_kv: int,
               num_splits: int | None = None) -> tuple[int, int]:
    """(NS, split): `split` keys per split, whole KV tiles, and the NS <= num_splits splits that cover max_context.

    Rounding the split up to whole tiles can leave fewer splits than asked for, never an empty one at full length:
    (NS - 1) * split < max_context <= NS * split.
    """
    wanted = num_splits or default_num_splits(num_seqs, num_kv_heads, max_context, block_kv)
    split = pl.cdiv(pl.cdiv(max_context, wanted), block_kv) * block_kv
    return pl.cdiv(max_context, split), split


def partial_bytes(num_seqs: int, num_kv_heads: int, num_splits: int, group: int, head_dim: int) -> int:
    """Bytes of the float32 partials (o_part and lse) one call stores; the merge reads them back once more."""
    return num_seqs * num_kv_heads * num_splits * group * (head_dim + 1) * 4


def _partials(q, k_pool, v_pool, layer, block_tables, context_lens, query_start_loc, *, num_splits, split, sm_scale,
              block_kv, num_warps, num_stages, interpret, sliding_window=None, logit_softcap=None):
    """The split kernel: (o_part [S, Hkv, NS, G, D], lse [S, Hkv, NS, G]), both float32, every element stored once."""
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads = k_pool.shape[2]
    num_seqs = block_tables.shape[0]
    group = num_q_heads // num_kv_heads
    gp = max(16, pow2_at_least(group))
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    kernel = functools.partial(_kernel, group=group, gp=gp, split=split, sm_scale=sm_scale, block_kv=block_kv,
                               sliding_window=sliding_window, logit_softcap=logit_softcap)
    return pl.pallas_call(
        kernel,
        grid=(num_seqs, num_kv_heads, num_splits),
        in_specs=[any_spec] * 7,
        out_specs=[any_spec, any_spec],
        out_shape=[jax.ShapeDtypeStruct((num_seqs, num_kv_heads, num_splits, group, head_dim), jnp.float32),
                   jax.ShapeDtypeStruct((num_seqs, num_kv_heads, num_splits, group), jnp.float32)],
        compiler_params=compiler_params(num_warps, num_stages),
        interpret=interpret,
        name="split_kv_paged_attention",
    )(jnp.asarray(layer, jnp.int32).reshape(1), block_tables, context_lens, query_start_loc, q, k_pool, v_pool)


def _kernel(layer_ref, tables_ref, context_lens_ref, query_start_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *,
            group, gp, split, sm_scale, block_kv, sliding_window, logit_softcap):
    seq, kv_head, split_idx = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    token = query_start_ref[seq]
    has_query = query_start_ref[seq + 1] > token
    context = jnp.where(has_query, context_lens_ref[seq], 0)

    g = jnp.arange(gp, dtype=jnp.int32)  # [GP]
    q = load_query_rows(q_ref, jnp.full((gp,), token), kv_head * group + g, (g < group) & has_query)  # [GP, D]

    # Splits cover the keys from the window's first tile (key 0 without a window) to the context's end.
    first_key = window_start(context - 1, sliding_window, block_kv)
    kv_start = first_key + split_idx * split
    kv_end = jnp.minimum(kv_start + split, context)  # <= kv_start for splits past the context: no steps
    layer = layer_ref[0]
    load_kv = lambda start: load_kv_tiles(k_ref, v_ref, layer, tables_ref, seq, kv_head, start, kv_end, block_kv)
    state = attend_kv_range(q, jnp.full((gp,), context - 1), kv_start, kv_end, load_kv, scale=sm_scale,
                            block_kv=block_kv, state=SoftmaxState.init(gp, q.shape[1]),
                            sliding_window=sliding_window, logit_softcap=logit_softcap)
    _store_rows(o_ref, lse_ref, (seq, kv_head, split_idx), g, g < group, state)


def _store_rows(o_ref, lse_ref, program, rows, valid, state: SoftmaxState) -> None:
    """Store the valid rows of a program's partial at o_ref[s, h, k, row, :] and lse_ref[s, h, k, row].

    o_ref: [S, Hkv, NS, G, D]; lse_ref: [S, Hkv, NS, G]; program: (s, h, k); rows, valid: [GP]. A padding row's
    index is past G: it is masked, so it is never written (on the GPU its address would be the next split's row).
    Every row of a padded sequence is stored too (0 and MASK_VALUE), so no element of the outputs is left unset.
    """
    dims = jnp.arange(o_ref.shape[-1], dtype=jnp.int32)[None, :]  # [1, D]
    store(o_ref.at[(*program, rows[:, None], dims)], state.normalized(), mask=valid[:, None])
    store(lse_ref.at[(*program, rows)], state.log2_sum_exp2(), mask=valid)


def _combine(o_part, lse, query_start_loc, q) -> jax.Array:
    """Merge the splits by their log-sum-exp and scatter each sequence's row to its token -> [T, Hq, D].

    o_part: [S, Hkv, NS, G, D], lse: [S, Hkv, NS, G], both float32. One split needs no merge: its partial is the
    output already.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs = lse.shape[0]
    if lse.shape[2] == 1:
        out = o_part[:, :, 0]  # [S, Hkv, G, D]
    else:
        weight = jnp.exp2(lse - lse.max(axis=2, keepdims=True))  # [S, Hkv, NS, G]; 1 at the max: the sum is >= 1
        out = (weight[..., None] * o_part).sum(axis=2) / weight.sum(axis=2)[..., None]  # [S, Hkv, G, D]
    out = out.reshape(num_seqs, num_q_heads, head_dim)  # [S, Hq, D]
    has_query = query_start_loc[1:] > query_start_loc[:-1]  # [S]
    dest = jnp.where(has_query, query_start_loc[:-1], num_tokens)  # [S]; padding goes out of range, dropped
    return jnp.zeros_like(q).at[dest].set(out.astype(q.dtype), mode="drop")
