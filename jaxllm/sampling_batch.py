"""SamplingBatch: the per-row sampling inputs of one step, packed on the host for the jitted sampler.

Every array has a leading row axis padded to `num_rows` S (the step's sampler bucket). Padded rows sample
greedily with no adjustments, so they cost nothing special and never produce NaN.

    temperature          [S]     float32  1 for greedy and padded rows (the sampler divides by it)
    is_greedy            [S]     bool     argmax rows (temperature < 1e-5, and padding)
    top_k                [S]     int32    0: disabled (also when >= vocab size)
    top_p, min_p         [S]     float32  1 / 0: disabled
    rng_key_data         [S, 2]  uint32   threefry key words of the request's seed, or of the engine's base seed
    rng_stream           [S]     uint32   0 for seeded requests; the request's rng_stream otherwise
    rng_counter          [S]     uint32   tokens generated so far (so each step draws fresh noise)
    wants_logprobs       []      bool     some row needs logprobs (asked for, or best_of ranks its samples by them)
    has_adjustments      []      bool     some row has logit adjustments (the sampler then applies them)

Dense logit adjustments; V = vocab size. The host packs them only when some row has any (else None); the
engine's runner then passes device-resident neutral arrays instead, so its sampler program always has them:

    bias                 [S, V]  float32  logit_bias, and -inf for EOS/stop ids while output < min_tokens
    seen                 [S, V]  bool     token occurs in prompt or output (repetition penalty)
    repetition_penalty   [S]     float32  1: disabled
    penalty              [S, V]  float32  frequency_penalty x count + presence_penalty x (count > 0), subtracted

Nothing here is static: whether a batch is all greedy, filters, has adjustments or asks for logprobs is read by
the sampler at run time, so one program per S serves every mix of requests.

RowSampling is one request's share, kept up to date token by token (the runner holds one per request it runs):
the penalty rows change in O(1) per token instead of being rebuilt from the whole history every step. A token
is counted when its step is dispatched (expect_token: the noise counter and min_tokens need only the count) and
recorded when its value arrives (record: the penalty rows need the value, so requests with penalties never have
a step scheduled ahead of their newest token).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import numpy as np
from flax import struct

from jaxllm.sampling_params import SamplingParams, SamplingType

_UINT32_MASK = 0xFFFFFFFF


@struct.dataclass
class LogitAdjustments:
    bias: jax.Array
    seen: jax.Array
    repetition_penalty: jax.Array
    penalty: jax.Array


@struct.dataclass
class SamplingBatch:
    temperature: jax.Array
    is_greedy: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    min_p: jax.Array
    rng_key_data: jax.Array
    rng_stream: jax.Array
    rng_counter: jax.Array
    wants_logprobs: jax.Array
    has_adjustments: jax.Array
    adjustments: LogitAdjustments | None = None


class RowSampling:
    """One request's sampling inputs: fixed scalars, plus penalty rows updated as its tokens arrive."""

    def __init__(self, params: SamplingParams, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int],
                 vocab_size: int, *, base_seed: int = 0, rng_stream: int = 0, eos_token_ids: Sequence[int] = (),
                 wants_logprobs: bool = False):
        self.params = params
        self.wants_logprobs = wants_logprobs or params.logprobs is not None  # the sampled tokens' logprobs
        greedy = params.sampling_type == SamplingType.GREEDY
        self.is_greedy = greedy
        self.temperature = 1.0 if greedy else params.temperature
        self.top_k = params.top_k if params.top_k < vocab_size else 0
        seed = base_seed if params.seed is None else params.seed
        self.key_words = ((seed >> 32) & _UINT32_MASK, seed & _UINT32_MASK)
        self.rng_stream = 0 if params.seed is not None else rng_stream & _UINT32_MASK
        self.num_output = len(output_token_ids)
        # EOS and stop ids cannot be sampled before min_tokens (ignore_eos does not lift this, as in vLLM)
        self.min_tokens_ids = np.array([*params.stop_token_ids, *eos_token_ids], np.int64)
        self.bias = None  # [V] float32, or None
        if params.logit_bias:
            self.bias = np.zeros(vocab_size, np.float32)
            self.bias[list(params.logit_bias)] = list(params.logit_bias.values())
        self.seen = self.penalty = self.counts = None  # [V] bool / float32 / int32, penalized requests only
        if params.needs_penalties:
            self.seen = np.zeros(vocab_size, bool)
            self.seen[np.asarray(prompt_token_ids, np.int64)] = True
            self.counts = np.zeros(vocab_size, np.int32)
            self.penalty = np.zeros(vocab_size, np.float32)
            for token in output_token_ids:
                self._count(token)

    def append(self, token: int) -> None:
        """Account for one more output token."""
        self.expect_token()
        self.record(token)

    def expect_token(self) -> None:
        """A token is being sampled (its value comes later): the noise counter and min_tokens move on now."""
        self.num_output += 1

    def record(self, token: int) -> None:
        """The value of a token counted by expect_token: the penalty rows take it in."""
        if self.counts is not None:
            self._count(token)

    def _count(self, token: int) -> None:
        self.seen[token] = True
        self.counts[token] += 1
        p = self.params
        self.penalty[token] = p.frequency_penalty * self.counts[token] + p.presence_penalty  # count > 0 now

    @property
    def masks_stop_ids(self) -> bool:
        return self.num_output < self.params.min_tokens and len(self.min_tokens_ids) > 0

    @property
    def needs_adjustments(self) -> bool:
        return self.bias is not None or self.counts is not None or self.masks_stop_ids


def pack_sampling_batch(rows: Sequence[RowSampling], num_rows: int, vocab_size: int) -> SamplingBatch:
    """Pack rows into numpy arrays padded to `num_rows` (padded rows are greedy and neutral)."""
    if len(rows) > num_rows:
        raise ValueError(f"{len(rows)} rows do not fit in num_rows={num_rows}")

    def column(values, fill, dtype) -> np.ndarray:
        out = np.full(num_rows, fill, dtype)
        out[:len(values)] = values
        return out

    key_data = np.zeros((num_rows, 2), np.uint32)
    key_data[:len(rows)] = np.array([r.key_words for r in rows], np.uint32).reshape(-1, 2)
    adjusted = any(r.needs_adjustments for r in rows)
    return SamplingBatch(
        temperature=column([r.temperature for r in rows], 1.0, np.float32),
        is_greedy=column([r.is_greedy for r in rows], True, bool),
        top_k=column([r.top_k for r in rows], 0, np.int32),
        top_p=column([r.params.top_p for r in rows], 1.0, np.float32),
        min_p=column([r.params.min_p for r in rows], 0.0, np.float32),
        rng_key_data=key_data,
        rng_stream=column([r.rng_stream for r in rows], 0, np.uint32),
        rng_counter=column([r.num_output & _UINT32_MASK for r in rows], 0, np.uint32),
        wants_logprobs=np.asarray(any(r.wants_logprobs for r in rows)),
        has_adjustments=np.asarray(adjusted),
        adjustments=_pack_adjustments(rows, num_rows, vocab_size) if adjusted else None,
    )


def neutral_adjustments(num_rows: int, vocab_size: int) -> LogitAdjustments:
    """Adjustments that change nothing (the runner keeps them on the device, one set per S bucket)."""
    dense = (num_rows, vocab_size)
    return LogitAdjustments(np.zeros(dense, np.float32), np.zeros(dense, bool), np.ones(num_rows, np.float32),
                            np.zeros(dense, np.float32))


def _pack_adjustments(rows: Sequence[RowSampling], num_rows: int, vocab_size: int) -> LogitAdjustments:
    adjust = neutral_adjustments(num_rows, vocab_size)
    for i, row in enumerate(rows):
        if row.bias is not None:
            adjust.bias[i] = row.bias
        if row.masks_stop_ids:
            adjust.bias[i, row.min_tokens_ids] = -math.inf
        if row.counts is not None:
            adjust.seen[i], adjust.penalty[i] = row.seen, row.penalty
            adjust.repetition_penalty[i] = row.params.repetition_penalty
    return adjust


@dataclasses.dataclass(frozen=True)
class SamplingRow:
    """One sequence to sample a token for, described in full (tests and one-off batches).

    rng_stream: a number distinct per request (e.g. the engine's request counter); unseeded requests draw
    their noise from (base seed, rng_stream, tokens generated so far). Seeded requests ignore it: their noise
    depends only on (seed, tokens generated so far), whatever else is in the batch.
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    rng_stream: int = 0


def build_sampling_batch(rows: Sequence[SamplingRow], num_rows: int, vocab_size: int, *, base_seed: int = 0,
                         eos_token_ids: Sequence[int] = ()) -> SamplingBatch:
    """Pack full row descriptions (see RowSampling for the incremental form the engine uses)."""
    states = [RowSampling(r.params, r.prompt_token_ids, r.output_token_ids, vocab_size, base_seed=base_seed,
                          rng_stream=r.rng_stream, eos_token_ids=eos_token_ids) for r in rows]
    return pack_sampling_batch(states, num_rows, vocab_size)
