"""Plain-jnp ragged paged attention: the reference every kernel is tested against, and the CPU path.

Pool layout (see docs/architecture.md):

    k_pool, v_pool: [L, N, Hkv, B, D]   L layers, N blocks, B tokens per block
    block 0 is the null block: padding writes land there and nothing reads it as context.

A step is ragged: sequence s owns query tokens q[query_start_loc[s] : query_start_loc[s+1]], which are its last
q_len tokens; context_lens[s] counts every token of s whose K/V is in the pool (cached prefix + this step's tokens).
Token j of sequence s lives in block block_tables[s, j // B] at offset j % B.

    sequence s:  |<------------- context_lens[s] ------------->|
                 |<--- cached prefix --->|<---- q_len[s] ----->|
    query i of s sits at position context_lens[s] - q_len[s] + i and sees keys 0..that position (causal).

No size but the arrays' own reaches the compiler: the work is cut into pieces of fixed shape and the number of
pieces is read from the data, in loops, so one program serves every mix of query lengths and context lengths.

    decode rows (q_len 1)    DECODE_ROWS rows at a time: [R, Hkv, G, D] queries against their own blocks
    longer rows (prefill)    query tiles of QUERY_TILE consecutive tokens of one sequence, numbered back to back
                             over the sequences (as the Pallas ragged kernel does): [TQ, Hkv, G, D] per tile

Each piece walks its keys KV_CHUNK_BLOCKS blocks at a time, from key 0 to the furthest key one of its queries may
see, gathering those blocks straight from the pool and keeping an online softmax in float32. A decode row costs
its own context rounded up to a chunk; a prefill chunk costs its own tiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite, so fully masked padding rows give no NaN
DECODE_ROWS = 16  # decode rows attended together
QUERY_TILE = 32  # query tokens per prefill tile
KV_CHUNK_BLOCKS = 4  # pool blocks gathered per step of the key loop


def ragged_paged_attention_reference(
    q: jax.Array,  # [T, Hq, D]
    k_pool: jax.Array,  # [L, N, Hkv, B, D]
    v_pool: jax.Array,  # [L, N, Hkv, B, D]
    layer: jax.Array | int,  # scalar: which layer of the pool to read
    block_tables: jax.Array,  # [S, MB] int32
    context_lens: jax.Array,  # [S] int32, 0 for padded sequences
    query_start_loc: jax.Array,  # [S+1] int32, non-decreasing; tokens past query_start_loc[S] are padding
    *,
    sm_scale: float,
) -> jax.Array:  # [T, Hq, D] in q.dtype; padding tokens get zeros
    num_tokens, num_seqs = q.shape[0], block_tables.shape[0]
    chunk = min(KV_CHUNK_BLOCKS, block_tables.shape[1])
    tables = _pad_columns(block_tables, chunk)  # [S, MB'] with MB' a multiple of the chunk
    q_lens = query_start_loc[1:] - query_start_loc[:-1]  # [S]
    kv = (k_pool, v_pool, layer, tables, chunk)
    is_decode = q_lens == 1  # [S]
    decoded = _decode_rows(q, kv, context_lens, query_start_loc, is_decode, sm_scale)  # [S + R, Hq, D]
    prefilled = _prefill_tiles(q, kv, context_lens, query_start_loc, q_lens, sm_scale)  # [T, Hq, D]

    token = jnp.arange(num_tokens, dtype=jnp.int32)  # [T]
    row = jnp.clip(jnp.searchsorted(query_start_loc, token, side="right", method="compare_all") - 1, 0,
                   num_seqs - 1)  # [T] the sequence owning each token
    decode_slot = jnp.cumsum(is_decode, dtype=jnp.int32) - 1  # [S] position of each decode row among them
    out = jnp.where(is_decode[row][:, None, None], decoded[decode_slot[row]], prefilled)
    is_query = token < query_start_loc[num_seqs]
    return jnp.where(is_query[:, None, None], out, 0).astype(q.dtype)


def _pad_columns(block_tables: jax.Array, chunk: int) -> jax.Array:
    extra = -block_tables.shape[1] % chunk
    return jnp.pad(block_tables, ((0, 0), (0, extra))) if extra else block_tables  # null-block padding


def _decode_rows(q, kv, context_lens, query_start_loc, is_decode, sm_scale) -> jax.Array:
    """Rows with one query token, DECODE_ROWS at a time -> [S + R, Hq, D] float32, row i = the i-th decode row."""
    num_seqs = context_lens.shape[0]
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads = kv[0].shape[2]
    group = min(DECODE_ROWS, num_seqs)
    rows = jnp.nonzero(is_decode, size=num_seqs + group, fill_value=0)[0]  # [S + R] decode rows first
    num_decode = jnp.sum(is_decode, dtype=jnp.int32)

    def attend_group(g, out):
        start = g * group
        ids = lax.dynamic_slice(rows, (start,), (group,))  # [R]
        valid = start + jnp.arange(group) < num_decode
        q_rows = q[query_start_loc[ids]].astype(jnp.float32)  # [R, Hq, D]
        q_rows = q_rows.reshape(group, num_kv_heads, 1, -1, head_dim)  # [R, Hkv, 1, G, D]
        context = jnp.where(valid, context_lens[ids], 0)  # [R]
        q_pos = jnp.broadcast_to(context[:, None] - 1, (group, 1))  # [R, 1]: sees keys < context
        res = _attend(q_rows, q_pos, context, kv, ids, sm_scale)  # [R, 1, Hq, D]
        return lax.dynamic_update_slice(out, res[:, 0], (start, 0, 0))

    num_groups = (num_decode + group - 1) // group
    out = jnp.zeros((num_seqs + group, num_q_heads, head_dim), jnp.float32)
    return lax.fori_loop(0, num_groups, attend_group, out)


def _prefill_tiles(q, kv, context_lens, query_start_loc, q_lens, sm_scale) -> jax.Array:
    """Rows with more than one query token, one tile at a time -> [T, Hq, D] float32 in token order.

    Tile i of a row covers its queries [i * TQ, (i + 1) * TQ); the last one may run past the row into later tokens.
    Tiles run in token order, so what such a tail writes is overwritten by the later rows' own tiles (or is a
    decode or padding token's, which the caller does not take from here).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = kv[0].shape[2]
    tile = min(QUERY_TILE, num_tokens)
    tiles_per_row = jnp.where(q_lens > 1, (q_lens + tile - 1) // tile, 0)  # [S]
    tile_ends = jnp.cumsum(tiles_per_row, dtype=jnp.int32)  # [S]
    q_padded = jnp.pad(q, ((0, tile), (0, 0), (0, 0)))  # [T + TQ, Hq, D]

    def attend_tile(i, out):
        seq = jnp.sum(tile_ends <= i, dtype=jnp.int32)  # the row owning tile i
        first = (i - (tile_ends[seq] - tiles_per_row[seq])) * tile  # the tile's first query within its row
        start = query_start_loc[seq] + first
        q_tile = lax.dynamic_slice_in_dim(q_padded, start, tile).astype(jnp.float32)  # [TQ, Hq, D]
        q_tile = q_tile.reshape(1, tile, num_kv_heads, -1, head_dim).transpose(0, 2, 1, 3, 4)  # [1, Hkv, TQ, G, D]
        cached = context_lens[seq] - q_lens[seq]
        q_pos = cached + first + jnp.arange(tile, dtype=jnp.int32)[None]  # [1, TQ]
        kv_end = cached + jnp.minimum(first + tile, q_lens[seq])  # keys past the tile's last query: unseen
        res = _attend(q_tile, q_pos, kv_end[None], kv, seq[None], sm_scale)  # [1, TQ, Hq, D]
        return lax.dynamic_update_slice_in_dim(out, res[0], start, axis=0)

    out = jnp.zeros((num_tokens + tile, num_q_heads, head_dim), jnp.float32)
    return lax.fori_loop(0, tile_ends[-1], attend_tile, out)[:num_tokens]


def _attend(q, q_pos, kv_end, kv, seqs, sm_scale) -> jax.Array:
    """Causal attention of R pieces over their own sequences' keys, KV_CHUNK_BLOCKS blocks per loop step.

    q: [R, Hkv, Q, G, D] float32 (Q queries of one sequence per piece); q_pos: [R, Q] their positions; kv_end: [R]
    keys at or past it are unseen; seqs: [R] the sequence of each piece. Returns [R, Q, Hq, D] float32.
    """
    k_pool, v_pool, layer, tables, chunk = kv
    rows, num_kv_heads, num_q, group, head_dim = q.shape
    block_size = k_pool.shape[3]
    width = chunk * block_size  # keys per step
    seq_tables = tables[seqs]  # [R, MB']

    def step(c, state):
        m, denom, acc = state  # [R, Hkv, Q, G], [R, Hkv, Q, G], [R, Hkv, Q, G, D]
        blocks = lax.dynamic_slice_in_dim(seq_tables, c * chunk, chunk, axis=1)  # [R, CB]
        k = k_pool[layer, blocks].astype(jnp.float32)  # [R, CB, Hkv, B, D]
        v = v_pool[layer, blocks].astype(jnp.float32)
        scores = _scores(q, k).reshape(rows, num_kv_heads, num_q, group, width)
        k_pos = c * width + jnp.arange(width, dtype=jnp.int32)  # [C]
        visible = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos[None, None, :] < kv_end[:, None, None])
        visible = visible[:, None, :, None, :]  # [R, 1, Q, 1, C]
        scores = jnp.where(visible, scores * sm_scale, MASK_VALUE)
        m_new = jnp.maximum(m, scores.max(axis=-1))
        alpha = jnp.exp(m - m_new)
        p = jnp.where(visible, jnp.exp(scores - m_new[..., None]), 0.0)  # [R, Hkv, Q, G, C]
        pv = _weighted_values(p.reshape(*p.shape[:-1], chunk, block_size), v)
        return m_new, denom * alpha + p.sum(axis=-1), acc * alpha[..., None] + pv

    num_steps = (jnp.max(kv_end) + width - 1) // width
    init = (jnp.full(q.shape[:-1], MASK_VALUE, jnp.float32), jnp.zeros(q.shape[:-1], jnp.float32),
            jnp.zeros(q.shape, jnp.float32))
    _, denom, acc = lax.fori_loop(0, num_steps, step, init)
    out = acc / jnp.where(denom > 0, denom, 1.0)[..., None]  # [R, Hkv, Q, G, D]; no visible key -> 0
    return out.transpose(0, 2, 1, 3, 4).reshape(rows, num_q, num_kv_heads * group, head_dim)


# XLA:CPU runs these dots several times slower with a size-1 query axis in them: decode pieces drop it.
def _scores(q, k):  # [R, Hkv, Q, G, D] x [R, CB, Hkv, B, D] -> [R, Hkv, Q, G, CB, B]
    if q.shape[2] == 1:
        return jnp.einsum("rhgd,rmhbd->rhgmb", q[:, :, 0], k)[:, :, None]
    return jnp.einsum("rhqgd,rmhbd->rhqgmb", q, k)


def _weighted_values(p, v):  # [R, Hkv, Q, G, CB, B] x [R, CB, Hkv, B, D] -> [R, Hkv, Q, G, D]
    if p.shape[2] == 1:
        return jnp.einsum("rhgmb,rmhbd->rhgd", p[:, :, 0], v)[:, :, None]
    return jnp.einsum("rhqgmb,rmhbd->rhqgd", p, v)
