"""SamplingBatch: the per-row sampling inputs of one step; LogitState: the per-request logit adjustments, per slot.

Per row (S = the step's sampler bucket; padded rows sample greedily with no adjustments, and never give NaN):

    temperature          [S]     float32  1 for greedy and padded rows (the sampler divides by it)
    is_greedy            [S]     bool     argmax rows (temperature < 1e-5, and padding)
    top_k                [S]     int32    0: disabled (also when >= vocab size)
    top_p, min_p         [S]     float32  1 / 0: disabled
    rng_key_data         [S, 2]  uint32   threefry key words of the request's seed, or of the engine's base seed
    rng_stream           [S]     uint32   0 for seeded requests; the request's rng_stream otherwise
    rng_counter          [S]     uint32   tokens generated so far (so each step draws fresh noise)
    slot                 [S]     int32    the row's slot in LogitState; its last slot (always neutral) if none
    repetition_penalty   [S]     float32  1: disabled
    frequency_penalty    [S]     float32  0: disabled
    presence_penalty     [S]     float32  0: disabled
    masks_stop_ids       [S]     bool     output < min_tokens: the slot's STOP_ID tokens get -inf
    wants_logprobs       []      bool     some row needs logprobs (asked for, or best_of ranks its samples by them)
    has_adjustments      []      bool     some row has logit adjustments now (the sampler then applies them)
    has_bitmask          []      bool     token_bitmask restricts some row (structured outputs)
    token_bitmask        [S, W]  int32    W = ceil(V / 32): bit t % 32 of word t // 32 set where token t may be
                                          sampled; every bit set in unconstrained rows. None: no row is
                                          constrained (the engine's runner always passes one)

LogitState holds, per slot, what is O(V) per request; M slots plus a last, neutral one that is never written:

    output_counts        [M+1, V]  int32    times each token was sampled (frequency, presence; > 0: seen)
    token_flags          [M+1, V]  int8     IN_PROMPT (repetition penalty) | STOP_ID (EOS and stop ids)
    bias                 [M+1, V]  float32  logit_bias (-inf outside allowed_token_ids)
    bad_words            [M+1, K, L]  int32 bad_words' token sequences, right-aligned, NO_TOKEN on the left;
                                            a sequence of NO_TOKEN is unused (K = MAX_BAD_WORDS, L = MAX_BAD_WORD_LEN)
    recent_tokens        [M+1, L-1]   int32 the last L-1 sampled tokens, newest last; NO_TOKEN before the first
    logprob_token_ids    [M+1, N]     int32 logprob_token_ids: the ids whose logprobs replace the top-N in the
                                            sampler's output, NO_TOKEN after them (N = MAX_LOGPROBS)

A bad word's last token gets -inf when the tokens sampled just before are the rest of it (vLLM's bad_words), so
the device, which holds the sampled tokens, decides: `recent_tokens` moves on with each one.

The token bitmask is not state: a grammar's next allowed tokens depend on the token just sampled, which the
host's matcher reads (structured_outputs/), so each step that samples a constrained row is sent its bitmask.

The engine's runner keeps the state on the device: a request that needs it (bias, a penalty, or min_tokens with
stop ids) is given a slot whose rows are written once (RowSampling.state_rows, one small program), and the sample
program counts each sampled token into its row. So nothing O(S x V) crosses the host per step, and no step waits
for a token's value on the host to penalize it: async scheduling serves every mix.

RowSampling is one request's share, on the host: its scalars, and a count of the tokens dispatched so far (the
noise counter and min_tokens need only the count, not the values). SamplingTable holds those of many requests as
columns, one row each (the runner's persistent batch): a step's SamplingBatch is a gather of its rows.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np
from flax import struct

from jaxllm.sampling_params import MAX_BAD_WORD_LEN, MAX_BAD_WORDS, MAX_LOGPROBS, SamplingParams, SamplingType

_UINT32_MASK = 0xFFFFFFFF
IN_PROMPT, STOP_ID = 1, 2  # LogitState.token_flags bits
NO_TOKEN = -1  # LogitState.bad_words padding (matches any token) and recent_tokens before the first token


@struct.dataclass
class LogitState:
    output_counts: jax.Array
    token_flags: jax.Array
    bias: jax.Array
    bad_words: jax.Array
    recent_tokens: jax.Array
    logprob_token_ids: jax.Array

    @property
    def neutral_slot(self) -> int:
        return self.bias.shape[0] - 1


def logit_row_shapes(vocab_size: int) -> LogitState:
    """One slot's rows: their shapes and dtypes (jax.ShapeDtypeStruct)."""
    spec = jax.ShapeDtypeStruct
    return LogitState(spec((vocab_size,), np.int32), spec((vocab_size,), np.int8), spec((vocab_size,), np.float32),
                      spec((MAX_BAD_WORDS, MAX_BAD_WORD_LEN), np.int32), spec((MAX_BAD_WORD_LEN - 1,), np.int32),
                      spec((MAX_LOGPROBS,), np.int32))


def logit_state_shapes(num_slots: int, vocab_size: int) -> LogitState:
    """num_slots writable slots and the neutral one: shapes and dtypes."""
    return jax.tree.map(lambda row: jax.ShapeDtypeStruct((num_slots + 1, *row.shape), row.dtype),
                        logit_row_shapes(vocab_size))


def empty_logit_state(num_slots: int, vocab_size: int) -> LogitState:
    """num_slots writable slots and the neutral one, all neutral (numpy): zeros, no bad words, no tokens."""
    shapes = logit_state_shapes(num_slots, vocab_size)
    fills = LogitState(0, 0, 0.0, NO_TOKEN, NO_TOKEN, NO_TOKEN)
    return jax.tree.map(lambda s, fill: np.full(s.shape, fill, s.dtype), shapes, fills)


def logit_state_bytes(num_slots: int, vocab_size: int) -> int:
    """Bytes of a LogitState of num_slots slots (the neutral slot included)."""
    return sum(s.size * s.dtype.itemsize for s in jax.tree.leaves(logit_state_shapes(num_slots, vocab_size)))


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
    slot: jax.Array
    repetition_penalty: jax.Array
    frequency_penalty: jax.Array
    presence_penalty: jax.Array
    masks_stop_ids: jax.Array
    wants_logprobs: jax.Array
    has_adjustments: jax.Array
    has_bitmask: jax.Array
    state: LogitState | None = None  # None: no row has adjustments
    token_bitmask: jax.Array | None = None  # None: no row is constrained


class RowSampling:
    """One request's sampling inputs on the host; `slot` is its LogitState slot (None: it needs none)."""

    def __init__(self, params: SamplingParams, num_output: int, vocab_size: int, *, base_seed: int = 0,
                 rng_stream: int = 0, eos_token_ids: Sequence[int] = (), wants_logprobs: bool = False):
        self.params = params
        self.vocab_size = vocab_size
        self.wants_logprobs = wants_logprobs or params.logprobs is not None  # the sampled tokens' logprobs
        greedy = params.sampling_type == SamplingType.GREEDY
        self.is_greedy = greedy
        self.temperature = 1.0 if greedy else params.temperature
        self.top_k = params.top_k if params.top_k < vocab_size else 0
        seed = base_seed if params.seed is None else params.seed
        self.key_words = ((seed >> 32) & _UINT32_MASK, seed & _UINT32_MASK)
        self.rng_stream = 0 if params.seed is not None else rng_stream & _UINT32_MASK
        self.num_output = num_output
        # EOS and stop ids cannot be sampled before min_tokens (ignore_eos does not lift this, as in vLLM)
        self.min_tokens_ids = np.array([*params.stop_token_ids, *eos_token_ids], np.int64)
        self.slot: int | None = None

    def expect_token(self) -> None:
        """A token is being sampled (its value stays on the device): the noise counter and min_tokens move on."""
        self.num_output += 1

    @property
    def needs_state(self) -> bool:
        """Whether the request needs a LogitState slot (at any point of its generation)."""
        return self.adjusts_always or self.stop_ids_until > 0 or bool(self.params.logprob_token_ids)

    @property
    def adjusts_always(self) -> bool:
        return self.params.biases_logits or self.params.needs_penalties or bool(self.params.bad_words_token_ids)

    @property
    def stop_ids_until(self) -> int:
        """Its EOS and stop ids are masked while fewer tokens than this were sampled (min_tokens; 0: never)."""
        return self.params.min_tokens if len(self.min_tokens_ids) > 0 else 0

    def state_rows(self, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]) -> LogitState:
        """The request's rows of LogitState ([V] each, numpy), from its whole history so far."""
        vocab = self.vocab_size
        counts = np.bincount(np.asarray(output_token_ids, np.int64), minlength=vocab).astype(np.int32)
        flags = np.zeros(vocab, np.int8)
        flags[np.asarray(prompt_token_ids, np.int64)] = IN_PROMPT
        if self.params.min_tokens > 0:
            flags[self.min_tokens_ids] |= STOP_ID
        bias = np.zeros(vocab, np.float32)
        if self.params.allowed_token_ids is not None:
            bias[:] = -np.inf
            bias[self.params.allowed_token_ids] = 0.0
        if self.params.logit_bias:
            bias[list(self.params.logit_bias)] = list(self.params.logit_bias.values())
        bad_words = np.full((MAX_BAD_WORDS, MAX_BAD_WORD_LEN), NO_TOKEN, np.int32)
        for row, word in zip(bad_words, self.params.bad_words_token_ids):
            row[MAX_BAD_WORD_LEN - len(word):] = word
        recent = np.full(MAX_BAD_WORD_LEN - 1, NO_TOKEN, np.int32)
        last = list(output_token_ids)[-(MAX_BAD_WORD_LEN - 1):]
        recent[len(recent) - len(last):] = last
        chosen = np.full(MAX_LOGPROBS, NO_TOKEN, np.int32)
        chosen[:len(self.params.logprob_token_ids or [])] = self.params.logprob_token_ids or []
        return LogitState(counts, flags, bias, bad_words, recent, chosen)


class SamplingTable:
    """The sampling inputs of up to M requests, one numpy column per field ([M + 1]; row M is padding: greedy and
    neutral, never set). What a request's parameters fix is written once (set_row); its count of sampled tokens
    moves on by rows (advance); a step's SamplingBatch is gathered from its rows (pack), with no Python per row."""

    def __init__(self, num_rows: int, neutral_slot: int):
        size = num_rows + 1
        self.pad_row = num_rows
        self.temperature = np.ones(size, np.float32)
        self.is_greedy = np.ones(size, bool)
        self.top_k = np.zeros(size, np.int32)
        self.top_p = np.ones(size, np.float32)
        self.min_p = np.zeros(size, np.float32)
        self.rng_key_data = np.zeros((size, 2), np.uint32)
        self.rng_stream = np.zeros(size, np.uint32)
        self.slot = np.full(size, neutral_slot, np.int32)
        self.repetition_penalty = np.ones(size, np.float32)
        self.frequency_penalty = np.zeros(size, np.float32)
        self.presence_penalty = np.zeros(size, np.float32)
        self.num_output = np.zeros(size, np.int64)  # tokens sampled so far (the noise counter; min_tokens)
        self.stop_ids_until = np.zeros(size, np.int64)  # RowSampling.stop_ids_until
        self.adjusts_always = np.zeros(size, bool)
        self.wants_logprobs = np.zeros(size, bool)
        self.neutral_slot = neutral_slot

    def set_row(self, row: int, sampling: RowSampling) -> None:
        """The row now holds this request (its slot: sampling.slot, or the neutral one)."""
        params = sampling.params
        self.temperature[row], self.is_greedy[row], self.top_k[row] = (sampling.temperature, sampling.is_greedy,
                                                                       sampling.top_k)
        self.top_p[row], self.min_p[row] = params.top_p, params.min_p
        self.rng_key_data[row], self.rng_stream[row] = sampling.key_words, sampling.rng_stream
        self.slot[row] = self.neutral_slot if sampling.slot is None else sampling.slot
        self.repetition_penalty[row] = params.repetition_penalty
        self.frequency_penalty[row], self.presence_penalty[row] = params.frequency_penalty, params.presence_penalty
        self.num_output[row], self.stop_ids_until[row] = sampling.num_output, sampling.stop_ids_until
        self.adjusts_always[row], self.wants_logprobs[row] = sampling.adjusts_always, sampling.wants_logprobs

    def advance(self, rows: np.ndarray) -> None:
        """A token is being sampled for each of `rows` [N] (distinct): see RowSampling.expect_token."""
        self.num_output[rows] += 1

    def pack(self, rows: np.ndarray, num_rows: int, offsets: np.ndarray | None = None) -> SamplingBatch:
        """The SamplingBatch of `rows` [N], in order, padded to num_rows; state None. offsets [N] (speculative
        decoding: a request's rows repeat, one per token of its run): added to each row's noise counter."""
        if len(rows) > num_rows:
            raise ValueError(f"{len(rows)} rows do not fit in num_rows={num_rows}")
        index = np.full(num_rows, self.pad_row, np.intp)  # [S]
        index[:len(rows)] = rows
        counts = self.num_output[index]
        if offsets is not None:
            counts[:len(rows)] += offsets
        masks_stop_ids = counts < self.stop_ids_until[index]
        return SamplingBatch(
            temperature=self.temperature[index], is_greedy=self.is_greedy[index], top_k=self.top_k[index],
            top_p=self.top_p[index], min_p=self.min_p[index], rng_key_data=self.rng_key_data[index],
            rng_stream=self.rng_stream[index], rng_counter=(counts & _UINT32_MASK).astype(np.uint32),
            slot=self.slot[index], repetition_penalty=self.repetition_penalty[index],
            frequency_penalty=self.frequency_penalty[index], presence_penalty=self.presence_penalty[index],
            masks_stop_ids=masks_stop_ids,
            wants_logprobs=np.asarray(self.wants_logprobs[index].any()),
            has_adjustments=np.asarray((self.adjusts_always[index] | masks_stop_ids).any()),
            has_bitmask=np.asarray(False))


def bitmask_width(vocab_size: int) -> int:
    """Words of a row of the token bitmask (32 tokens each)."""
    return -(-vocab_size // 32)


def pack_sampling_batch(rows: Sequence[RowSampling], num_rows: int, neutral_slot: int) -> SamplingBatch:
    """Pack rows into numpy arrays padded to `num_rows` (padded rows are greedy and neutral); state None."""
    table = SamplingTable(len(rows), neutral_slot)
    for row, sampling in enumerate(rows):
        table.set_row(row, sampling)
    return table.pack(np.arange(len(rows)), num_rows)


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
    """Pack full row descriptions, with a host LogitState of one slot per row when some row has adjustments
    (the engine's runner keeps its state on the device instead)."""
    states = [RowSampling(r.params, len(r.output_token_ids), vocab_size, base_seed=base_seed,
                          rng_stream=r.rng_stream, eos_token_ids=eos_token_ids) for r in rows]
    for slot, sampling in enumerate(states):
        sampling.slot = slot if sampling.needs_state else None
    batch = pack_sampling_batch(states, num_rows, neutral_slot=num_rows)
    if not batch.has_adjustments:
        return batch
    state = empty_logit_state(num_rows, vocab_size)
    for row, sampling in zip(rows, states):
        if sampling.slot is not None:
            rows_of_slot = sampling.state_rows(row.prompt_token_ids, row.output_token_ids)
            for table, values in zip(jax.tree.leaves(state), jax.tree.leaves(rows_of_slot)):
                table[sampling.slot] = values
    return batch.replace(state=state)
