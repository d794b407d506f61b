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
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite, so fully masked padding rows give no NaN


def ragged_paged_attention_reference(
    q: jax.Array,  # [T, Hq, D]
    k_pool: jax.Array,  # [L, N, Hkv, B, D]
    v_pool: jax.Array,  # [L, N, Hkv, B, D]
    layer: jax.Array | int,  # scalar: which layer of the pool to read
    block_tables: jax.Array,  # [S, MB] int32
    context_lens: jax.Array,  # [S] int32, 0 for padded sequences
    query_start_loc: jax.Array,  # [S+1] int32, non-decreasing; tokens past query_start_loc[S] are padding
    *,
    max_query_len: int,  # static upper bound on any q_len[s]
    sm_scale: float,
    num_prefill_rows: int | None = None,  # static layout hint, see below
) -> jax.Array:  # [T, Hq, D] in q.dtype; padding tokens get zeros
    """Queries are laid out per sequence, [rows, Qm], so the cost is rows * Qm * context. With
    num_prefill_rows = P, rows [0, S-P) promise at most one query token (decodes, Qm = 1) and only the last P rows
    are padded to max_query_len; None pads every row to max_query_len."""
    num_seqs = block_tables.shape[0]
    prefill_rows = num_seqs if num_prefill_rows is None else num_prefill_rows
    decode_rows = num_seqs - prefill_rows
    q_lens = query_start_loc[1:] - query_start_loc[:-1]  # [S]
    parts = []
    for rows, width in ((slice(0, decode_rows), 1), (slice(decode_rows, num_seqs), max_query_len)):
        if rows.stop > rows.start:
            parts.append(_attend_rows(q, k_pool, v_pool, layer, block_tables[rows], context_lens[rows],
                                      query_start_loc[:-1][rows], q_lens[rows], width, sm_scale))
    out = jnp.concatenate(parts)  # [decode_rows + prefill_rows * Qm, Hq, D]: slots, sequence by sequence

    # Gather each token's slot back into the flat token order (a gather: XLA:CPU scatters run serially).
    token = jnp.arange(q.shape[0], dtype=jnp.int32)  # [T]
    row = jnp.clip(jnp.searchsorted(query_start_loc, token, side="right", method="compare_all") - 1, 0,
                   num_seqs - 1)  # [T]
    offset = token - query_start_loc[row]
    slot = jnp.where(row < decode_rows, row, decode_rows + (row - decode_rows) * max_query_len + offset)
    is_query = token < query_start_loc[num_seqs]
    return jnp.where(is_query[:, None, None], out[slot], 0).astype(q.dtype)


def _attend_rows(q, k_pool, v_pool, layer, block_tables, context_lens, q_starts, q_lens, width: int,
                 sm_scale: float) -> jax.Array:
    """Attention for R sequences whose queries are padded to `width` slots each -> [R*W, Hq, D] in q.dtype."""
    num_tokens, num_q_heads, head_dim = q.shape
    rows, max_blocks = block_tables.shape
    num_kv_heads, block_size = k_pool.shape[2], k_pool.shape[3]
    group = num_q_heads // num_kv_heads

    slot = jnp.arange(width, dtype=jnp.int32)  # [W]
    token_idx = q_starts[:, None] + slot[None, :]  # [R, W]
    q_seq = q[jnp.clip(token_idx, 0, num_tokens - 1)]  # [R, W, Hq, D]
    q_seq = q_seq.reshape(rows, width, num_kv_heads, group, head_dim).astype(jnp.float32)

    # float32 math throughout (XLA:CPU has no batched bf16 x bf16 -> f32 dot for every layout). The context
    # stays in the pool's [MB, Hkv, B] order: transposing it to [Hkv, MB*B] first costs more than the dots.
    k = pool_blocks(k_pool, layer, block_tables).astype(jnp.float32)  # [R, MB, Hkv, B, D]
    v = pool_blocks(v_pool, layer, block_tables).astype(jnp.float32)  # [R, MB, Hkv, B, D]
    context = max_blocks * block_size

    # XLA:CPU runs these dots several times slower with a size-1 query axis in them: decode rows drop it.
    if width == 1:
        scores = jnp.einsum("rhgd,rmhbd->rhgmb", q_seq[:, 0], k)[:, :, :, None]
    else:
        scores = jnp.einsum("rqhgd,rmhbd->rhgqmb", q_seq, k)
    scores = scores.reshape(rows, num_kv_heads, group, width, context) * sm_scale  # [R, Hkv, G, W, C]
    q_pos = (context_lens - q_lens)[:, None] + slot[None, :]  # [R, W]
    k_pos = jnp.arange(context, dtype=jnp.int32)  # [C]
    visible = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos[None, None, :] < context_lens[:, None, None])
    scores = jnp.where(visible[:, None, None], scores, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).reshape(rows, num_kv_heads, group, width, max_blocks, block_size)
    if width == 1:
        out = jnp.einsum("rhgmb,rmhbd->rhgd", probs[:, :, :, 0], v)[:, None]
    else:
        out = jnp.einsum("rhgqmb,rmhbd->rqhgd", probs, v)  # [R, W, Hkv, G, D]
    return out.reshape(rows * width, num_q_heads, head_dim).astype(q.dtype)


def pool_blocks(pool: jax.Array, layer, block_tables: jax.Array) -> jax.Array:
    """[L, N, Hkv, B, D] pool -> [S, MB, Hkv, B, D]: each sequence's blocks in order, from one layer."""
    return pool[layer, block_tables]
