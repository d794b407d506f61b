"""SamplingBatch: the per-row sampling parameters of one step, packed on the host for the jitted sampler.

Every array has a leading row axis padded to `num_rows` R (the step's logits bucket). Padded rows sample
greedily with no adjustments, so they cost nothing special and never produce NaN.

    temperature          [R]     float32  1 for greedy and padded rows (the sampler divides by it)
    is_greedy            [R]     bool     argmax rows (temperature < 1e-5, and padding)
    top_k                [R]     int32    0: disabled (also when >= vocab size)
    top_p, min_p         [R]     float32  1 / 0: disabled
    repetition_penalty   [R]     float32  1: disabled
    frequency_penalty    [R]     float32  0: disabled
    presence_penalty     [R]     float32  0: disabled
    rng_key_data         [R, 2]  uint32   threefry key words of the request's seed, or of the engine's base seed
    rng_stream           [R]     uint32   0 for seeded requests; the request's rng_stream otherwise
    rng_counter          [R]     uint32   tokens generated so far (so each step draws fresh noise)

Sparse logit adjustments, L a power of two >= 32 (L = 0 when no row has any; the sampler then skips them):

    adjust_token_ids     [R, L]  int32    distinct token ids per row; padding = vocab size (dropped)
    adjust_bias          [R, L]  float32  logit_bias, and -inf for EOS/stop ids while output < min_tokens
    adjust_seen          [R, L]  bool     token occurs in prompt or output (repetition penalty)
    adjust_output_counts [R, L]  int32    occurrences in the output (frequency and presence penalties)

Static fields (part of the jit cache key), chosen so that cheap batches skip expensive work:

    all_greedy    bool    no row samples randomly: no temperature, filtering or noise
    needs_filter  bool    some random row uses top-k, top-p or min-p (False when all_greedy)
    num_logprobs  int     NO_LOGPROBS (-1): none requested, no log-softmax; else a bucket of the most top
                          logprobs any row asked for, from LOGPROBS_BUCKETS = (0, 5, 20); 0 still returns
                          the sampled token's logprob and rank

Compiled variants per logits shape [R, V]: 3 sampling modes (greedy; random; random + filter) x 4 logprob
buckets x (1 + number of adjustment lengths L in use: 32, 64, ... up to the next power of two of the longest
prompt + output, capped at V).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import numpy as np
from flax import struct

from jaxllm.sampling_params import SamplingParams, SamplingType

NO_LOGPROBS = -1
LOGPROBS_BUCKETS = (0, 5, 20)
MIN_ADJUST_LEN = 32
_UINT32_MASK = 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class SamplingRow:
    """One sequence to sample a token for.

    rng_stream: a number distinct per request (e.g. the engine's request counter); unseeded requests draw
    their noise from (base seed, rng_stream, tokens generated so far). Seeded requests ignore it: their noise
    depends only on (seed, tokens generated so far), whatever else is in the batch.
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    rng_stream: int = 0


@struct.dataclass
class SamplingBatch:
    temperature: jax.Array
    is_greedy: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    min_p: jax.Array
    repetition_penalty: jax.Array
    frequency_penalty: jax.Array
    presence_penalty: jax.Array
    rng_key_data: jax.Array
    rng_stream: jax.Array
    rng_counter: jax.Array
    adjust_token_ids: jax.Array
    adjust_bias: jax.Array
    adjust_seen: jax.Array
    adjust_output_counts: jax.Array
    all_greedy: bool = struct.field(pytree_node=False)
    needs_filter: bool = struct.field(pytree_node=False)
    num_logprobs: int = struct.field(pytree_node=False)


def build_sampling_batch(rows: Sequence[SamplingRow], num_rows: int, vocab_size: int, *, base_seed: int = 0,
                         eos_token_ids: Sequence[int] = ()) -> SamplingBatch:
    """Pack `rows` into numpy arrays padded to `num_rows`.

    eos_token_ids: the model's EOS ids; with each request's stop_token_ids they cannot be sampled while the
    request has fewer than min_tokens output tokens (ignore_eos does not lift this, as in vLLM).
    """
    if len(rows) > num_rows:
        raise ValueError(f"{len(rows)} rows do not fit in num_rows={num_rows}")
    params = [row.params for row in rows]
    sampled = [p for p in params if p.sampling_type != SamplingType.GREEDY]
    adjustments = [_row_adjustments(row, eos_token_ids) for row in rows]
    return SamplingBatch(
        **_per_row_arrays(rows, num_rows, vocab_size, base_seed),
        **_adjustment_arrays(adjustments, num_rows, vocab_size),
        all_greedy=not sampled,
        needs_filter=any(0 < p.top_k < vocab_size or p.top_p < 1 or p.min_p > 0 for p in sampled),
        num_logprobs=_logprobs_bucket(params),
    )


def _per_row_arrays(rows: Sequence[SamplingRow], num_rows: int, vocab_size: int, base_seed: int) -> dict:
    """The [R] parameter arrays and the [R, 2] key words; padded rows are greedy and neutral."""
    params = [row.params for row in rows]
    greedy = [p.sampling_type == SamplingType.GREEDY for p in params]

    def column(values, fill, dtype) -> np.ndarray:
        out = np.full(num_rows, fill, dtype)
        out[:len(values)] = values
        return out

    seeds = [base_seed if p.seed is None else p.seed for p in params]
    key_data = np.zeros((num_rows, 2), np.uint32)
    key_data[:len(rows)] = np.array([((s >> 32) & _UINT32_MASK, s & _UINT32_MASK) for s in seeds],
                                    np.uint32).reshape(-1, 2)
    return dict(
        temperature=column([1.0 if g else p.temperature for p, g in zip(params, greedy)], 1.0, np.float32),
        is_greedy=column(greedy, True, bool),
        top_k=column([p.top_k if p.top_k < vocab_size else 0 for p in params], 0, np.int32),
        top_p=column([p.top_p for p in params], 1.0, np.float32),
        min_p=column([p.min_p for p in params], 0.0, np.float32),
        repetition_penalty=column([p.repetition_penalty for p in params], 1.0, np.float32),
        frequency_penalty=column([p.frequency_penalty for p in params], 0.0, np.float32),
        presence_penalty=column([p.presence_penalty for p in params], 0.0, np.float32),
        rng_key_data=key_data,
        rng_stream=column([0 if p.seed is not None else r.rng_stream & _UINT32_MASK for r, p in zip(rows, params)],
                          0, np.uint32),
        rng_counter=column([len(r.output_token_ids) & _UINT32_MASK for r in rows], 0, np.uint32),
    )


@dataclasses.dataclass
class _Adjustments:
    """One row's sparse adjustments, over distinct sorted token ids."""

    token_ids: np.ndarray  # [n] int64
    bias: np.ndarray  # [n] float32
    seen: np.ndarray  # [n] bool
    output_counts: np.ndarray  # [n] int32


def _row_adjustments(row: SamplingRow, eos_token_ids: Sequence[int]) -> _Adjustments | None:
    """None when the row needs no adjustment (the common case, kept cheap)."""
    p = row.params
    bias = dict(p.logit_bias or {})
    if len(row.output_token_ids) < p.min_tokens:
        bias.update(dict.fromkeys([*p.stop_token_ids, *eos_token_ids], -math.inf))
    if not bias and not p.needs_penalties:
        return None
    bias_ids = np.fromiter(bias.keys(), np.int64, len(bias))
    prompt = output = np.zeros(0, np.int64)
    if p.needs_penalties:
        prompt, output = np.asarray(row.prompt_token_ids, np.int64), np.asarray(row.output_token_ids, np.int64)
    ids, where = np.unique(np.concatenate([bias_ids, prompt, output]), return_inverse=True)
    adj = _Adjustments(ids, np.zeros(len(ids), np.float32), np.zeros(len(ids), bool), np.zeros(len(ids), np.int32))
    adj.bias[where[:len(bias_ids)]] = np.fromiter(bias.values(), np.float32, len(bias))
    adj.seen[where[len(bias_ids):]] = True
    adj.output_counts[:] = np.bincount(where[len(bias_ids) + len(prompt):], minlength=len(ids))
    return adj


def _adjustment_arrays(adjustments: Sequence[_Adjustments | None], num_rows: int, vocab_size: int) -> dict:
    """[R, L] arrays, L = 0 or a power of two >= MIN_ADJUST_LEN (capped at the vocab size)."""
    longest = max((len(a.token_ids) for a in adjustments if a is not None), default=0)
    length = 0 if longest == 0 else min(max(MIN_ADJUST_LEN, 1 << (longest - 1).bit_length()), vocab_size)
    out = {"adjust_token_ids": np.full((num_rows, length), vocab_size, np.int32),
           "adjust_bias": np.zeros((num_rows, length), np.float32),
           "adjust_seen": np.zeros((num_rows, length), bool),
           "adjust_output_counts": np.zeros((num_rows, length), np.int32)}
    for i, adj in enumerate(adjustments):
        if adj is None:
            continue
        n = len(adj.token_ids)
        out["adjust_token_ids"][i, :n] = adj.token_ids
        out["adjust_bias"][i, :n] = adj.bias
        out["adjust_seen"][i, :n] = adj.seen
        out["adjust_output_counts"][i, :n] = adj.output_counts
    return out


def _logprobs_bucket(params: Sequence[SamplingParams]) -> int:
    requested = [p.logprobs for p in params if p.logprobs is not None]
    if not requested:
        return NO_LOGPROBS
    return next(b for b in LOGPROBS_BUCKETS if b >= max(requested))
