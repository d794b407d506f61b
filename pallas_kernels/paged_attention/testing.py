"""Random ragged paged-attention inputs, shared by the kernel tests and the GPU check script.

A case is a list of (q_len, context_len) pairs, one per sequence ((0, 0) is a padded sequence in place), plus optional
padding: padded sequences (context 0, q_len 0, null-block tables) after the last one and padding tokens after the last
sequence's tokens. Each sequence gets
cdiv(context_len, B) distinct blocks drawn from a shuffled pool, so block tables are non-contiguous and unordered.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference

NULL_BLOCK = 0
TOLERANCE = {jnp.dtype(jnp.float32): 2e-5, jnp.dtype(jnp.bfloat16): 2e-2}  # relative_error, interpret mode on CPU


class RaggedCase(NamedTuple):
    q: jax.Array  # [T, Hq, D]
    k_pool: jax.Array  # [L, N, Hkv, B, D]
    v_pool: jax.Array  # [L, N, Hkv, B, D]
    layer: jax.Array  # scalar int32
    block_tables: jax.Array  # [S, MB] int32
    context_lens: jax.Array  # [S] int32
    query_start_loc: jax.Array  # [S+1] int32
    max_query_len: int

    def args(self) -> tuple:
        """Positional arguments of the reference and the kernels."""
        return self[:7]

    @property
    def num_valid_tokens(self) -> int:
        return int(self.query_start_loc[-1])


def random_ragged_case(
    seed: int,
    seqs: Sequence[tuple[int, int]],  # (q_len, context_len) per sequence; q_len <= context_len
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype=jnp.float32,
    num_layers: int = 2,
    pad_seqs: int = 0,
    pad_tokens: int = 0,
    pad_blocks: int = 0,  # extra null-block columns in the block tables
    spare_blocks: int = 1,  # pool blocks nobody owns
    max_query_len: int | None = None,
    device_rng: bool = False,  # values from jax.random on the device instead of numpy on the host
) -> RaggedCase:
    rng = np.random.default_rng(seed)
    q_lens = np.array([q for q, _ in seqs], np.int32)
    ctx = np.array([c for _, c in seqs], np.int32)
    if np.any(q_lens > ctx):
        raise ValueError(f"q_len exceeds context_len in {seqs}")
    blocks_per_seq = -(-ctx // block_size)
    num_blocks = 1 + int(blocks_per_seq.sum()) + spare_blocks
    ids = iter(rng.permutation(np.arange(1, num_blocks, dtype=np.int32)))
    max_blocks = max(1, int(blocks_per_seq.max(initial=0))) + pad_blocks
    num_seqs = len(seqs) + pad_seqs

    tables = np.full((num_seqs, max_blocks), NULL_BLOCK, np.int32)
    for s, n in enumerate(blocks_per_seq):
        tables[s, :n] = [next(ids) for _ in range(n)]
    starts = np.zeros(num_seqs + 1, np.int32)
    starts[1:len(seqs) + 1] = np.cumsum(q_lens)
    starts[len(seqs) + 1:] = starts[len(seqs)]
    context_lens = np.zeros(num_seqs, np.int32)
    context_lens[:len(seqs)] = ctx

    num_tokens = int(q_lens.sum()) + pad_tokens
    q_shape = (num_tokens, num_q_heads, head_dim)  # [T, Hq, D]
    pool_shape = (num_layers, num_blocks, num_kv_heads, block_size, head_dim)  # [L, N, Hkv, B, D]
    if device_rng:
        q, k_pool, v_pool = _device_normal(seed, q_shape, pool_shape, jnp.dtype(dtype))
    else:
        normal = lambda shape: jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dtype)
        q, k_pool, v_pool = normal(q_shape), normal(pool_shape), normal(pool_shape)
    return RaggedCase(
        q=q,
        k_pool=k_pool,
        v_pool=v_pool,
        layer=jnp.int32(num_layers - 1),
        block_tables=jnp.asarray(tables),
        context_lens=jnp.asarray(context_lens),
        query_start_loc=jnp.asarray(starts),
        max_query_len=max_query_len or max(1, int(q_lens.max(initial=0))),
    )


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _device_normal(seed, q_shape, pool_shape, dtype):
    """Standard-normal q, k_pool, v_pool generated on the device: seconds to compile, fast for GB-sized pools."""
    keys = jax.random.split(jax.random.key(seed), 3)
    shapes = (q_shape, pool_shape, pool_shape)
    return tuple(jax.random.normal(key, shape, jnp.float32).astype(dtype) for key, shape in zip(keys, shapes))


def unused_slots_mask(case: RaggedCase) -> jax.Array:
    """[N, B] bool: pool slots that hold no context token of any sequence (null block, block tails, spare blocks)."""
    num_blocks, block_size = case.k_pool.shape[1], case.k_pool.shape[3]
    used = np.zeros((num_blocks, block_size), bool)
    tables, ctx = np.asarray(case.block_tables), np.asarray(case.context_lens)
    for s in range(tables.shape[0]):
        tokens = np.arange(ctx[s])
        used[tables[s, tokens // block_size], tokens % block_size] = True
    return jnp.asarray(~used)


def poison_unused_slots(case: RaggedCase, fill: float) -> RaggedCase:
    """Set every pool slot that holds no context token of the case's layer, and the whole other layer, to `fill`.

    A kernel run on a NaN-poisoned pool that still matches the reference never let a masked lane into its result.
    """
    layer = int(case.layer)
    unused = unused_slots_mask(case)[:, None, :, None]  # [N, 1, B, 1]

    def poison(pool):
        layer_pool = jnp.where(unused, jnp.asarray(fill, pool.dtype), pool[layer])
        return jnp.full_like(pool, fill).at[layer].set(layer_pool)

    return case._replace(k_pool=poison(case.k_pool), v_pool=poison(case.v_pool))


def reference_output(case: RaggedCase, sm_scale: float, **options) -> np.ndarray:
    """The reference on the case with unused pool slots zeroed -> [T, Hq, D] float32. options: sliding_window,
    logit_softcap."""
    clean = poison_unused_slots(case, 0.0)
    attend = jax.jit(functools.partial(ragged_paged_attention_reference, sm_scale=sm_scale, **options))
    return np.asarray(attend(*clean.args()), np.float32)


def dense_oracle(case: RaggedCase, sm_scale: float, sliding_window: int | None = None,
                 logit_softcap: float | None = None) -> np.ndarray:
    """The attention contract spelled out token by token in float64 numpy -> [T, Hq, D]: slow, obviously right,
    and independent of the reference's loops (the reference is tested against it). The query at position p sees
    keys max(0, p - sliding_window + 1) .. p; scores are capped as c * tanh(scores * sm_scale / c)."""
    q = np.asarray(case.q, np.float64)
    layer = int(case.layer)
    k_pool, v_pool = (np.asarray(p[layer], np.float64) for p in (case.k_pool, case.v_pool))  # [N, Hkv, B, D]
    tables, ctx, starts = (np.asarray(a) for a in (case.block_tables, case.context_lens, case.query_start_loc))
    block_size, group = k_pool.shape[2], q.shape[1] // k_pool.shape[1]
    out = np.zeros_like(q)
    for s in range(tables.shape[0]):
        q_len = starts[s + 1] - starts[s]
        for i in range(q_len):
            pos = ctx[s] - q_len + i  # the query's position
            first = 0 if sliding_window is None else max(0, pos - sliding_window + 1)
            keys = np.arange(first, pos + 1)  # causal, within the window: [K]
            k = k_pool[tables[s, keys // block_size], :, keys % block_size]  # [K, Hkv, D]
            v = v_pool[tables[s, keys // block_size], :, keys % block_size]
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # [K, Hq, D]
            scores = np.einsum("hd,khd->hk", q[starts[s] + i], k) * sm_scale  # [Hq, K]
            if logit_softcap is not None:
                scores = logit_softcap * np.tanh(scores / logit_softcap)
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[starts[s] + i] = np.einsum("hk,khd->hd", p / p.sum(axis=1, keepdims=True), v)
    return out


def relative_error(actual: jax.Array, expected: jax.Array) -> float:
    """max |actual - expected| / max |expected|, in float32."""
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-30))


def poison_keys_before(case: RaggedCase, seq: int, num_keys: int, fill: float = float("nan")) -> RaggedCase:
    """The case with K and V of sequence seq's first num_keys tokens (in the case's layer) set to `fill`.

    An implementation that skips the keys wholly before a window never reads them: its result stays finite."""
    tables, block_size = np.asarray(case.block_tables), case.k_pool.shape[3]
    tokens = np.arange(num_keys)
    index = (int(case.layer), tables[seq, tokens // block_size], slice(None), tokens % block_size)
    return case._replace(k_pool=case.k_pool.at[index].set(fill), v_pool=case.v_pool.at[index].set(fill))
