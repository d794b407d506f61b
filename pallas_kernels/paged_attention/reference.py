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

Options (static Python values, as Hugging Face's Mistral / Gemma 2 / Gemma 3 define them; None: off):

    sliding_window   W >= 1: the query at position p sees key j iff j <= p and p - j < W (its last W keys)
    logit_softcap    c > 0: scores = c * tanh(scores * sm_scale / c) (scale first, then cap), before masking

No size but the arrays' own reaches the compiler: the work is cut into pieces of fixed shape and the number of
pieces is read from the data, in loops, so one program serves every mix of query lengths and context lengths.

    decode rows (q_len 1)    DECODE_ROWS rows at a time: [R, Hkv, G, D] queries against their own blocks
    longer rows (prefill)    query tiles of QUERY_TILE consecutive tokens of one sequence, numbered back to back
                             over the sequences (as the Pallas ragged kernel does): [TQ, Hkv, G, D] per tile

Each piece walks its keys KV_CHUNK_BLOCKS blocks at a time, from the chunk holding the first key one of its queries
may see (key 0 without a window) to the furthest one, gathering those blocks straight from the pool and keeping an
online softmax in float32. A decode row costs its own context (or its window) rounded up to a chunk; a prefill
chunk costs its own tiles.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

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
    sliding_window: int | None = None,  # static: each query sees its last sliding_window keys (itself included)
    logit_softcap: float | None = None,  # static: scores capped to (-logit_softcap, logit_softcap) by tanh
) -> jax.Array:  # [T, Hq, D] in q.dtype; padding tokens get zeros
    check_attention_options(sliding_window, logit_softcap)
    num_tokens, num_seqs = q.shape[0], block_tables.shape[0]
    chunk = min(KV_CHUNK_BLOCKS, block_tables.shape[1])
    tables = _pad_columns(block_tables, chunk)  # [S, MB'] with MB' a multiple of the chunk
    q_lens = query_start_loc[1:] - query_start_loc[:-1]  # [S]
    kv = KeySource(k_pool, v_pool, layer, tables, chunk, sm_scale, sliding_window, logit_softcap)
    is_decode = q_lens == 1  # [S]
    decoded = _decode_rows(q, kv, context_lens, query_start_loc, is_decode)  # [S + R, Hq, D]
    prefilled = _prefill_tiles(q, kv, context_lens, query_start_loc, q_lens)  # [T, Hq, D]

    token = jnp.arange(num_tokens, dtype=jnp.int32)  # [T]
    row = jnp.clip(jnp.searchsorted(query_start_loc, token, side="right", method="compare_all") - 1, 0,
                   num_seqs - 1)  # [T] the sequence owning each token
    decode_slot = jnp.cumsum(is_decode, dtype=jnp.int32) - 1  # [S] position of each decode row among them
    out = jnp.where(is_decode[row][:, None, None], decoded[decode_slot[row]], prefilled)
    is_query = token < query_start_loc[num_seqs]
    return jnp.where(is_query[:, None, None], out, 0).astype(q.dtype)


def check_attention_options(sliding_window: int | None, logit_softcap: float | None) -> None:
    """Reject option values no attention implementation accepts, naming the argument (both are static: a traced
    value is refused too)."""
    if sliding_window is not None and (not _is_number(sliding_window, numbers.Integral) or sliding_window < 1):
        raise ValueError(f"sliding_window must be a static integer >= 1 (Python or NumPy) or None, "
                         f"got {sliding_window!r}")
    if logit_softcap is not None and (not _is_number(logit_softcap, numbers.Real) or not 0 < logit_softcap < math.inf):
        raise ValueError(f"logit_softcap must be a static finite number > 0 (Python or NumPy) or None, "
                         f"got {logit_softcap!r}")


def _is_number(value, kind) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def softcap_scores(scores: jax.Array, sm_scale: float, logit_softcap: float | None) -> jax.Array:
    """scores * sm_scale, capped to (-logit_softcap, logit_softcap) by tanh when a cap is set; same shape."""
    if logit_softcap is None:
        return scores * sm_scale
    return logit_softcap * jnp.tanh(scores * (sm_scale / logit_softcap))


class KeySource(NamedTuple):
    """Where the keys come from and how scores are made: the pools, their block tables and the static options."""
    k_pool: jax.Array  # [L, N, Hkv, B, D]
    v_pool: jax.Array  # [L, N, Hkv, B, D]
    layer: jax.Array | int
    tables: jax.Array  # [S, MB'] with MB' a multiple of chunk
    chunk: int  # blocks per step of the key loop
    sm_scale: float
    sliding_window: int | None
    logit_softcap: float | None


def _pad_columns(block_tables: jax.Array, chunk: int) -> jax.Array:
    extra = -block_tables.shape[1] % chunk
    return jnp.pad(block_tables, ((0, 0), (0, extra))) if extra else block_tables  # null-block padding


def _decode_rows(q, kv: KeySource, context_lens, query_start_loc, is_decode) -> jax.Array:
    """Rows with one query token, DECODE_ROWS at a time -> [S + R, Hq, D] float32, row i = the i-th decode row."""
    num_seqs = context_lens.shape[0]
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads = kv.k_pool.shape[2]
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
        res = _attend(q_rows, q_pos, context, kv, ids)  # [R, 1, Hq, D]
        return lax.dynamic_update_slice(out, res[:, 0], (start, 0, 0))

    num_groups = (num_decode + group - 1) // group
    out = jnp.zeros((num_seqs + group, num_q_heads, head_dim), jnp.float32)
    return lax.fori_loop(0, num_groups, attend_group, out)


def _prefill_tiles(q, kv: KeySource, context_lens, query_start_loc, q_lens) -> jax.Array:
    """Rows with more than one query token, one tile at a time -> [T, Hq, D] float32 in token order.

    Tile i of a row covers its queries [i * TQ, (i + 1) * TQ); the last one may run past the row into later tokens.
    Tiles run in token order, so what such a tail writes is overwritten by the later rows' own tiles (or is a
    decode or padding token's, which the caller does not take from here).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = kv.k_pool.shape[2]
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
        res = _attend(q_tile, q_pos, kv_end[None], kv, seq[None])  # [1, TQ, Hq, D]
        return lax.dynamic_update_slice_in_dim(out, res[0], start, axis=0)

    out = jnp.zeros((num_tokens + tile, num_q_heads, head_dim), jnp.float32)
    return lax.fori_loop(0, tile_ends[-1], attend_tile, out)[:num_tokens]


def _attend(q, q_pos, kv_end, kv: KeySource, seqs) -> jax.Array:
    """Causal attention of R pieces over their own sequences' keys, KV_CHUNK_BLOCKS blocks per loop step.

    q: [R, Hkv, Q, G, D] float32 (Q queries of one sequence per piece); q_pos: [R, Q] their positions; kv_end: [R]
    keys at or past it are unseen; seqs: [R] the sequence of each piece. Returns [R, Q, Hq, D] float32.
    Each piece starts at the chunk of the first key its first query may see (chunk 0 without a window), so a
    windowed piece reads its window, not its whole context.
    """
    rows, num_kv_heads, num_q, group, head_dim = q.shape
    block_size = kv.k_pool.shape[3]
    width = kv.chunk * block_size  # keys per step
    seq_tables = kv.tables[seqs]  # [R, MB']
    first_chunk = _first_chunks(q_pos, kv.sliding_window, width)  # [R] or None (every piece from chunk 0)

    def step(c, state):
        m, denom, acc = state  # [R, Hkv, Q, G], [R, Hkv, Q, G], [R, Hkv, Q, G, D]
        chunk_index = c if first_chunk is None else first_chunk + c  # scalar or [R]
        blocks = _chunk_blocks(seq_tables, chunk_index, kv.chunk)  # [R, CB]
        k = kv.k_pool[kv.layer, blocks].astype(jnp.float32)  # [R, CB, Hkv, B, D]
        v = kv.v_pool[kv.layer, blocks].astype(jnp.float32)
        scores = _scores(q, k).reshape(rows, num_kv_heads, num_q, group, width)
        k_pos = jnp.reshape(chunk_index, (-1, 1, 1)) * width + jnp.arange(width, dtype=jnp.int32)  # [R|1, 1, C]
        visible = _visible(k_pos, q_pos[:, :, None], kv_end[:, None, None], kv.sliding_window)  # [R, Q, C]
        visible = visible[:, None, :, None, :]  # [R, 1, Q, 1, C]
        scores = jnp.where(visible, softcap_scores(scores, kv.sm_scale, kv.logit_softcap), MASK_VALUE)
        m_new = jnp.maximum(m, scores.max(axis=-1))
        alpha = jnp.exp(m - m_new)
        p = jnp.where(visible, jnp.exp(scores - m_new[..., None]), 0.0)  # [R, Hkv, Q, G, C]
        pv = _weighted_values(p.reshape(*p.shape[:-1], kv.chunk, block_size), v)
        return m_new, denom * alpha + p.sum(axis=-1), acc * alpha[..., None] + pv

    if first_chunk is None:
        num_steps = (jnp.max(kv_end) + width - 1) // width
    else:
        num_steps = jnp.max(jnp.maximum((kv_end + width - 1) // width - first_chunk, 0))  # the longest piece's
    init = (jnp.full(q.shape[:-1], MASK_VALUE, jnp.float32), jnp.zeros(q.shape[:-1], jnp.float32),
            jnp.zeros(q.shape, jnp.float32))
    _, denom, acc = lax.fori_loop(0, num_steps, step, init)
    out = acc / jnp.where(denom > 0, denom, 1.0)[..., None]  # [R, Hkv, Q, G, D]; no visible key -> 0
    return out.transpose(0, 2, 1, 3, 4).reshape(rows, num_q, num_kv_heads * group, head_dim)


def _first_chunks(q_pos, sliding_window: int | None, width: int) -> jax.Array | None:
    """[R] the chunk holding the first key any query of each piece sees (q_pos [R, Q]); None without a window."""
    if sliding_window is None:
        return None
    return jnp.maximum(q_pos.min(axis=1) - sliding_window + 1, 0) // width


def _chunk_blocks(seq_tables, chunk_index, chunk: int) -> jax.Array:
    """Block ids of chunk `chunk_index` (a scalar, or [R]: one per piece) of each piece's table [R, MB'] -> [R, CB].

    Per-piece chunks past a table's end (pieces whose keys ran out earlier) read its last columns: masked keys."""
    if jnp.ndim(chunk_index) == 0:
        return lax.dynamic_slice_in_dim(seq_tables, chunk_index * chunk, chunk, axis=1)
    cols = chunk_index[:, None] * chunk + jnp.arange(chunk, dtype=jnp.int32)  # [R, CB]
    return jnp.take_along_axis(seq_tables, jnp.minimum(cols, seq_tables.shape[1] - 1), axis=1)


def _visible(k_pos, q_pos, kv_end, sliding_window: int | None) -> jax.Array:
    """Whether each query sees each key: causal, before kv_end, and within the window when one is set."""
    visible = (k_pos <= q_pos) & (k_pos < kv_end)
    if sliding_window is not None:
        visible &= q_pos - k_pos < sliding_window
    return visible


# XLA:CPU runs these dots several times slower with a size-1 query axis in them: decode pieces drop it.
def _scores(q, k):  # [R, Hkv, Q, G, D] x [R, CB, Hkv, B, D] -> [R, Hkv, Q, G, CB, B]
    if q.shape[2] == 1:
        return jnp.einsum("rhgd,rmhbd->rhgmb", q[:, :, 0], k)[:, :, None]
    return jnp.einsum("rhqgd,rmhbd->rhqgmb", q, k)


def _weighted_values(p, v):  # [R, Hkv, Q, G, CB, B] x [R, CB, Hkv, B, D] -> [R, Hkv, Q, G, D]
    if p.shape[2] == 1:
        return jnp.einsum("rhgmb,rmhbd->rhgd", p[:, :, 0], v)[:, :, None]
    return jnp.einsum("rhqgmb,rmhbd->rhqgd", p, v)
