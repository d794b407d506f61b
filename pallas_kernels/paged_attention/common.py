"""In-kernel pieces shared by the ragged and the split-KV paged-attention kernels.

Both kernels hold a tile of M query rows that share one KV head and stream that head's keys and values out of the
paged pool in tiles of `block_kv` tokens, keeping an online softmax in float32:

    pool [L, N, Hkv, B, D]:   token j of sequence s  ->  pool[layer, block_tables[s, j // B], kv_head, j % B, :]

Every ref access is one gather with broadcast index arrays (one flat pointer tensor for Triton; the only form the
CPU interpreter accepts for gathers). Lanes outside the valid range are masked: the GPU never dereferences them and
they read as zero, so garbage or stale pool contents cannot leak NaN into the softmax.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.paged_attention.reference import MASK_VALUE
from pallas_kernels.triton_compat import load

LOG2_E = math.log2(math.e)  # the softmax runs in base 2: exp(x) == exp2(x * log2(e))


class SoftmaxState(NamedTuple):
    acc: jax.Array  # [M, D] float32, sum_j p_j v_j with p relative to m
    m: jax.Array  # [M] float32, running max of the base-2 scores (MASK_VALUE before any visible key)
    denom: jax.Array  # [M] float32, sum_j p_j (0 while no key was visible)

    @staticmethod
    def init(rows: int, head_dim: int) -> "SoftmaxState":
        return SoftmaxState(jnp.zeros((rows, head_dim), jnp.float32), jnp.full((rows,), MASK_VALUE, jnp.float32),
                            jnp.zeros((rows,), jnp.float32))

    def normalized(self) -> jax.Array:  # [M, D] float32; rows that saw no key come out as 0
        return self.acc / self._safe_denom()[:, None]

    def log2_sum_exp2(self) -> jax.Array:  # [M] float32, log2 sum_j 2^score_j; MASK_VALUE for rows that saw no key
        return jnp.where(self.denom > 0, self.m + jnp.log2(self._safe_denom()), MASK_VALUE)

    def _safe_denom(self) -> jax.Array:
        return jnp.where(self.denom > 0, self.denom, 1.0)


def check_shapes(q: jax.Array, k_pool: jax.Array, block_kv: int) -> None:
    """Reject shapes the kernels cannot tile: q [T, Hq, D], k_pool [L, N, Hkv, B, D]."""
    head_dim, num_q_heads, num_kv_heads = q.shape[2], q.shape[1], k_pool.shape[2]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    for name, value in (("head_dim", head_dim), ("block_kv", block_kv)):
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (a Triton dot dimension), got {value}")


def load_query_rows(q_ref, tokens, heads, valid) -> jax.Array:
    """q[tokens[r], heads[r], :] for each row r -> [M, D]; invalid rows read as 0.

    q_ref: [T, Hq, D]; tokens, heads, valid: [M]. Invalid rows may index past the array: they are never read.
    """
    dims = jnp.arange(q_ref.shape[-1], dtype=jnp.int32)[None, :]  # [1, D]
    return load(q_ref.at[tokens[:, None], heads[:, None], dims], mask=valid[:, None], other=0)


def load_kv_tiles(k_ref, v_ref, layer, table_ref, seq, kv_head, start, end,
                  block_kv: int) -> tuple[jax.Array, jax.Array]:
    """Keys and values of tokens start .. start+block_kv-1 of sequence `seq`, one KV head -> 2 x [block_kv, D].

    k_ref, v_ref: [L, N, Hkv, B, D] pools; table_ref: [S, MB] block tables. Tokens >= end read as 0. Tokens past the
    table's end only occur in the masked tail of a last tile; their table column is clamped so that even their
    addresses stay in bounds.
    """
    block_size, head_dim = k_ref.shape[3], k_ref.shape[4]
    tokens = start + jnp.arange(block_kv, dtype=jnp.int32)  # [BK], >= 0: C division is floor division
    table_col = jnp.minimum(jax.lax.div(tokens, block_size), table_ref.shape[1] - 1)  # [BK]
    blocks = table_ref[seq, table_col]  # [BK] block ids
    dims = jnp.arange(head_dim, dtype=jnp.int32)[None, :]  # [1, D]
    index = (layer, blocks[:, None], kv_head, jax.lax.rem(tokens, block_size)[:, None], dims)
    mask = (tokens < end)[:, None]  # [BK, 1]
    return load(k_ref.at[index], mask=mask, other=0), load(v_ref.at[index], mask=mask, other=0)


def attend_kv_range(q, q_pos, kv_start, kv_end, load_kv, *, scale: float, block_kv: int, state: SoftmaxState,
                    sliding_window: int | None = None, logit_softcap: float | None = None) -> SoftmaxState:
    """Fold keys kv_start .. kv_end-1 into the online softmax of q, causally (and within the window, if any).

    q: [M, D]; q_pos: [M] position of each row's query token (row r sees key j iff j <= q_pos[r], and
    q_pos[r] - j < sliding_window when a window is set). load_kv: tile start -> (k, v), each [block_kv, D].
    scale: the softmax scale; logit_softcap: scores become c * tanh(scores * scale / c). Both options are static:
    None compiles to the plain kernel. Runs cdiv(kv_end - kv_start, block_kv) steps, none when the range is empty;
    the caller starts the range at the first key its first row may see.
    """

    def step(i, s: SoftmaxState) -> SoftmaxState:
        start = kv_start + i * block_kv
        k, v = load_kv(start)  # [BK, D] each
        k_pos = start + jnp.arange(block_kv, dtype=jnp.int32)  # [BK]
        visible = (k_pos[None, :] < kv_end) & (k_pos[None, :] <= q_pos[:, None])  # [M, BK]
        if sliding_window is not None:
            visible &= q_pos[:, None] - k_pos[None, :] < sliding_window
        scores = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        scores = jnp.where(visible, _log2_scores(scores, scale, logit_softcap), MASK_VALUE)  # [M, BK]
        m = jnp.maximum(s.m, scores.max(axis=1))  # [M]
        alpha = jnp.exp2(s.m - m)  # [M] rescales what was accumulated against the old max
        p = jnp.where(visible, jnp.exp2(scores - m[:, None]), 0.0)  # [M, BK]
        pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return SoftmaxState(s.acc * alpha[:, None] + pv, m, s.denom * alpha + p.sum(axis=1))

    num_steps = jax.lax.div(jnp.maximum(kv_end - kv_start + block_kv - 1, 0), block_kv)
    return jax.lax.fori_loop(0, num_steps, step, state)


def window_start(first_pos, sliding_window: int | None, block_kv: int):
    """Where the key loop of queries at positions >= first_pos starts: 0 without a window, else the start of the
    block_kv tile (counted from key 0) holding the first key the query at first_pos sees, so tiles stay aligned."""
    if sliding_window is None:
        return 0
    return jnp.maximum(first_pos - sliding_window + 1, 0) // block_kv * block_kv


def _log2_scores(scores, scale: float, logit_softcap: float | None):
    """Raw q.k scores [M, BK] -> the softmax's scores in base 2 (times log2(e)), soft-capped when a cap is set."""
    if logit_softcap is None:
        return scores * (scale * LOG2_E)
    return jnp.tanh(scores * (scale / logit_softcap)) * (logit_softcap * LOG2_E)
