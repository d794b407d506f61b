"""Batched sampling with per-row parameters: one pure, jittable function of (logits, SamplingBatch).

Order, as vLLM v1:
  0. rows with a token bitmask (structured outputs): -inf on the tokens their grammar does not allow now;
  1. logprobs from the raw logits (log-softmax of the model output), if any row asked for them;
  2. adjustments (when the batch carries a LogitState), read from each row's slot: logit_bias, bad_words and
     min_tokens (-inf), then the repetition, frequency and presence penalties;
  3. greedy rows take the argmax; the others divide by their temperature, drop tokens by min-p, top-k and
     top-p (in that order), and sample with the Gumbel-max trick in its exponential-race form:
     argmax_i p_i / E_i with E_i ~ Exp(1), i.e. argmax_i log p_i + G_i with G_i = -log E_i Gumbel (as vLLM).

Filtering never sorts the vocabulary: each cut is a threshold on the row's logits, read off the row's top
NUM_CANDIDATES logits (lax.top_k) when the kept set lies within them, else found exactly by bisection over
the whole row, BISECT_ROWS rows at a time and only for the rows that need it.

What a batch needs is decided at run time (lax.cond), not by the compiler: an all-greedy batch with no adjustment,
bitmask or logprobs is one argmax, an all-greedy batch skips the noise and the filters, a batch without
top-k/top-p/min-p skips the filters, one without adjustments skips them, one without logprobs skips the
log-softmax. So one program per logits shape serves every mix of requests, and its
outputs have fixed shapes: logprob fields are zeros when no row asked for them.

The noise is a keyed integer hash of (row key, token id); the row key is derived with jax.random from
(seed, stream, tokens generated so far), so a row's noise depends on nothing else. On CPU this costs a
fraction of a threefry draw per logit (benchmarks/sampler_cpu.py), and the race needs one log per logit where
Gumbel noise -log(-log u) needs two.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from jaxllm.model.kernels import REFERENCE, Kernels
from jaxllm.sampling_batch import IN_PROMPT, NO_TOKEN, STOP_ID, LogitState, SamplingBatch
from jaxllm.sampling_params import MAX_LOGPROBS
from pallas_kernels.argmax.cpu import argmax_rows_cpu
from pallas_kernels.argmax.reference import argmax_rows

NUM_CANDIDATES = 256  # logits per row searched for the top-k / top-p cut before falling back to bisection
BISECT_ROWS = 16  # rows bisected together when their cut lies beyond the candidates


@struct.dataclass
class SamplerOutput:
    """Sampled tokens and their logprobs from the raw logits (zeros when no row asked for logprobs).

    sampled_token_ids      [R]     int32
    sampled_logprobs       [R]     float32  logprob of the sampled token
    sampled_ranks          [R]     int32    1 + number of tokens with a larger logprob
    top_logprob_token_ids  [R, N]  int32    N = MAX_LOGPROBS, most likely first (a request keeps its own count);
                                            a row with logprob_token_ids: those ids, in their order
    top_logprobs           [R, N]  float32
    """

    sampled_token_ids: jax.Array
    sampled_logprobs: jax.Array
    sampled_ranks: jax.Array
    top_logprob_token_ids: jax.Array
    top_logprobs: jax.Array


def sample(logits: jax.Array, batch: SamplingBatch, kernels: Kernels = REFERENCE) -> SamplerOutput:
    """logits [R, V] float32 -> one token per row (see the module docstring for the order of operations);
    kernels.argmax says how a row's argmax over the vocabulary runs."""
    logits = logits.astype(jnp.float32)
    plain_greedy = jnp.all(batch.is_greedy) & ~batch.wants_logprobs  # and nothing below changes a logit:
    if batch.token_bitmask is not None:
        plain_greedy &= ~batch.has_bitmask
    if batch.state is not None:
        plain_greedy &= ~batch.has_adjustments
    # the argmax alone: the general path's cond over the adjustments returns the logits unchanged, which costs a
    # copy of them (1.3 ms a batch-64 step of the default model on CPU, benchmarks/RESULTS.md)
    return lax.cond(plain_greedy, lambda: _no_logprobs(vocabulary_argmax(logits, kernels), _num_top(logits)),
                    lambda: _sample_general(logits, batch, kernels))


def _num_top(logits: jax.Array) -> int:
    return min(MAX_LOGPROBS, logits.shape[1])


def _sample_general(logits: jax.Array, batch: SamplingBatch, kernels: Kernels) -> SamplerOutput:
    if batch.token_bitmask is not None:
        logits = lax.cond(batch.has_bitmask, lambda: apply_token_bitmask(logits, batch.token_bitmask),
                          lambda: logits)
    adjusted = logits  # [R, V]
    if batch.state is not None:  # the false branch copies the logits (they stay live for the logprobs); a cond
        # returning tokens instead would hold the sampling code twice (benchmarks/RESULTS.md, "logits copy")
        adjusted = lax.cond(batch.has_adjustments, lambda: apply_adjustments(logits, batch, batch.state),
                            lambda: logits)
    greedy = vocabulary_argmax(adjusted, kernels)  # [R]
    tokens = lax.cond(jnp.all(batch.is_greedy), lambda: greedy,
                      lambda: jnp.where(batch.is_greedy, greedy, _random_sample(adjusted, batch, kernels)))
    num_top = _num_top(logits)

    def with_logprobs():
        logprobs = jax.nn.log_softmax(logits, axis=-1)
        chosen, ranks, top_ids, top_logprobs = token_logprobs(logprobs, tokens, num_top)
        if batch.state is not None:  # rows with logprob_token_ids report those ids instead of the top-N
            asked = batch.state.logprob_token_ids[batch.slot][:, :num_top]  # [R, N]
            top_ids, top_logprobs = _asked_ids(logprobs, asked, top_ids, top_logprobs)
        return SamplerOutput(tokens, chosen, ranks, top_ids, top_logprobs)

    return lax.cond(batch.wants_logprobs, with_logprobs, lambda: _no_logprobs(tokens, num_top))


def vocabulary_argmax(x: jax.Array, kernels: Kernels) -> jax.Array:
    """x [R, V] float32 -> [R] int32, jnp.argmax's first largest index: the native kernel where kernels.argmax is
    "cpu" (XLA:CPU's own argmax does not vectorize: ~17x slower on [64, 49152], benchmarks/RESULTS.md)."""
    return argmax_rows_cpu(x) if kernels.argmax == "cpu" else argmax_rows(x)


def apply_token_bitmask(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
    """-inf where a row's bitmask does not allow the token. logits [R, V]; bitmask [R, ceil(V / 32)] int32, bit
    t % 32 of word t // 32 set where token t is allowed. -> [R, V]."""
    bits = (bitmask[:, :, None] >> jnp.arange(32, dtype=bitmask.dtype)) & 1  # [R, W, 32]
    allowed = bits.reshape(bitmask.shape[0], -1)[:, :logits.shape[1]] != 0  # [R, V]
    return jnp.where(allowed, logits, -jnp.inf)


def apply_adjustments(logits: jax.Array, batch: SamplingBatch, state: LogitState) -> jax.Array:
    """logit_bias, bad_words and min_tokens masks, then vLLM's penalties, from each row's slot of `state`.
    [R, V] -> [R, V].

    repetition: logits of tokens in prompt or output are divided by the penalty when > 0, else multiplied;
    frequency: minus penalty x count in the output; presence: minus penalty once if in the output.
    """
    counts = state.output_counts[batch.slot]  # [R, V]; the gathers fuse into the arithmetic below
    flags = state.token_flags[batch.slot]
    x = ban_bad_words(logits + state.bias[batch.slot], state.bad_words[batch.slot], state.recent_tokens[batch.slot])
    x = jnp.where(batch.masks_stop_ids[:, None] & ((flags & STOP_ID) != 0), -jnp.inf, x)
    seen = (counts > 0) | ((flags & IN_PROMPT) != 0)
    rep = batch.repetition_penalty[:, None]
    x = jnp.where(seen, jnp.where(x > 0, x / rep, x * rep), x)
    penalty = batch.frequency_penalty[:, None] * counts + jnp.where(counts > 0, batch.presence_penalty[:, None], 0)
    return x - penalty


def ban_bad_words(x: jax.Array, words: jax.Array, recent: jax.Array) -> jax.Array:
    """-inf on each bad word's last token where the row's latest tokens are the rest of the word (vLLM's rule).

    x [R, V]; words [R, K, L] right-aligned token sequences, NO_TOKEN on the left (any token) and in unused
    ones; recent [R, L-1] the row's last sampled tokens, newest last, NO_TOKEN before its first.
    """
    prefix, last = words[:, :, :-1], words[:, :, -1]  # [R, K, L-1], [R, K]
    matched = jnp.all((prefix == NO_TOKEN) | (prefix == recent[:, None, :]), axis=-1)  # [R, K]
    banned = jnp.where(matched & (last != NO_TOKEN), last, x.shape[1])  # V: nothing banned
    return x.at[jnp.arange(x.shape[0])[:, None], banned].set(-jnp.inf, mode="drop")


def count_sampled(state: LogitState, batch: SamplingBatch, tokens: jax.Array) -> LogitState:
    """Each row's sampled token [R] counted into its slot's output counts and appended to its recent tokens
    (the neutral slot stays as it is)."""
    real = batch.slot != state.neutral_slot  # [R]
    recent = state.recent_tokens[batch.slot]  # [R, L-1]
    moved_on = jnp.where(real[:, None], jnp.concatenate([recent[:, 1:], tokens[:, None]], axis=1), recent)
    return state.replace(output_counts=state.output_counts.at[batch.slot, tokens].add(real.astype(jnp.int32)),
                         recent_tokens=state.recent_tokens.at[batch.slot].set(moved_on))


def _random_sample(adjusted: jax.Array, batch: SamplingBatch, kernels: Kernels) -> jax.Array:
    z = adjusted / batch.temperature[:, None]  # [R, V]
    random_rows = ~batch.is_greedy
    filters = random_rows & ((batch.top_k > 0) | (batch.top_p < 1) | (batch.min_p > 0))
    z = lax.cond(jnp.any(filters), lambda: apply_top_k_top_p_min_p(z, batch.top_k, batch.top_p, batch.min_p),
                 lambda: z)
    keys = _row_keys(batch.rng_key_data, batch.rng_stream, batch.rng_counter)
    probs = jnp.exp(z - z.max(axis=-1, keepdims=True))  # [R, V] unnormalised; 0 where masked
    return vocabulary_argmax(probs / exponential_noise(keys, z.shape[1]), kernels)


def apply_top_k_top_p_min_p(z: jax.Array, top_k: jax.Array, top_p: jax.Array, min_p: jax.Array) -> jax.Array:
    """Set to -inf the tokens dropped by min-p, then top-k, then top-p (vLLM's semantics). z [R, V] -> [R, V].

    min-p keeps p >= min_p * p_max; top-k keeps logits >= the k-th largest (ties kept); top-p, over the
    tokens left, keeps a token when the probability of the tokens strictly more likely is < top_p * their
    total. Each keeps {z >= threshold}; top_k <= 0, top_p >= 1 or min_p <= 0 disables that cut.
    """
    num_candidates = min(NUM_CANDIDATES, z.shape[1])
    z_max = z.max(axis=-1, keepdims=True)  # [R, 1]
    candidates = lax.top_k(z, num_candidates)[0]  # [R, K], descending
    cut_min_p = jnp.where(min_p > 0, z_max[:, 0] + jnp.log(min_p), -jnp.inf)
    cut_top_k = _threshold(z, jnp.ones_like(z), candidates, jnp.ones_like(candidates),
                           top_k.astype(jnp.float32), active=top_k > 0)
    cut = jnp.maximum(cut_min_p, cut_top_k)  # [R]

    mass = jnp.where(z >= cut[:, None], jnp.exp(z - z_max), 0.0)  # [R, V] unnormalised, kept so far
    candidate_mass = jnp.where(candidates >= cut[:, None], jnp.exp(candidates - z_max), 0.0)
    cut_top_p = _threshold(z, mass, candidates, candidate_mass, top_p * mass.sum(-1), active=top_p < 1)
    cut = jnp.maximum(cut, cut_top_p)
    return jnp.where(z >= cut[:, None], z, -jnp.inf)


def _threshold(z, weights, candidates, candidate_weights, target, active):
    """Per row, the largest logit x with sum(weights[z >= x]) >= target; -inf where not active.

    z, weights [R, V]; candidates [R, K] the row's largest logits, descending, candidate_weights their weights;
    target, active [R]. Read off the candidates when their weights reach the target, else found by bisection.
    """
    cumulative = jnp.cumsum(candidate_weights, axis=1)  # [R, K]
    first = jnp.argmax(cumulative >= target[:, None], axis=1)  # [R]
    from_candidates = jnp.take_along_axis(candidates, first[:, None], axis=1)[:, 0]
    beyond = active & (cumulative[:, -1] < target)
    cut = lax.cond(jnp.any(beyond),  # the guard skips the loop's fixed cost (~10 ms on CPU) when idle
                   lambda: jnp.where(beyond, _bisect_rows(z, weights, target, beyond), from_candidates),
                   lambda: from_candidates)
    return jnp.where(active, cut, -jnp.inf)


def _bisect_rows(z, weights, target, rows_wanted):
    """`_bisect_threshold` of the rows where rows_wanted [R], BISECT_ROWS rows at a time."""
    num_rows = z.shape[0]

    def body(state):
        pending, cut = state
        rows = jnp.nonzero(pending, size=min(BISECT_ROWS, num_rows), fill_value=num_rows)[0]  # [B]; R: none
        take = jnp.minimum(rows, num_rows - 1)
        found = _bisect_threshold(z[take], weights[take], target[take])  # [B]
        return pending.at[rows].set(False, mode="drop"), cut.at[rows].set(found, mode="drop")

    _, cut = lax.while_loop(lambda state: jnp.any(state[0]), body, (rows_wanted, jnp.zeros(num_rows, z.dtype)))
    return cut


def _bisect_threshold(z, weights, target):
    """Exact `_threshold` over whole rows: bisection on the logits' order-preserving uint32 keys (32 passes).

    Invariant: weight(keys >= lo) >= target > weight(keys >= hi); the answer is a logit of the row.
    """
    keys = _ordered_keys(z)  # [B, V]

    def step(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        enough = jnp.where(keys >= mid[:, None], weights, 0).sum(-1) >= target
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    lo = jnp.zeros(z.shape[0], jnp.uint32)
    lo, _ = lax.fori_loop(0, 32, step, (lo, keys.max(-1) + 1))
    return _from_ordered_keys(lo)


def _ordered_keys(x: jax.Array) -> jax.Array:
    """float32 -> uint32 with the same order (-0.0 is first made +0.0)."""
    bits = lax.bitcast_convert_type(x + 0.0, jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _from_ordered_keys(keys: jax.Array) -> jax.Array:
    bits = jnp.where(keys >> 31 == 1, keys & jnp.uint32(0x7FFFFFFF), ~keys)
    return lax.bitcast_convert_type(bits, jnp.float32)


def _row_keys(key_data: jax.Array, stream: jax.Array, counter: jax.Array) -> jax.Array:
    """[R, 2] key words of fold_in(fold_in(key(seed words), stream), counter), one per row."""

    def one(data, s, c):
        key = jax.random.wrap_key_data(data, impl="threefry2x32")
        return jax.random.key_data(jax.random.fold_in(jax.random.fold_in(key, s), c))

    return jax.vmap(one)(key_data, stream, counter)


def exponential_noise(keys: jax.Array, vocab_size: int) -> jax.Array:
    """Exp(1) noise [R, V] in [6e-8, 16.6] from per-row key words [R, 2]: two keyed rounds of the murmur3
    finaliser over the token id (a bijection of the id for a fixed key), 23 bits -> uniform u in (0, 1), -log u."""
    ids = jnp.arange(vocab_size, dtype=jnp.uint32)[None, :]  # [1, V]
    bits = _mix32(_mix32(ids * jnp.uint32(0x9E3779B9) ^ keys[:, :1]) ^ keys[:, 1:])  # [R, V]
    uniform = ((bits >> 9).astype(jnp.float32) + 0.5) * (1.0 / (1 << 23))
    return -jnp.log(uniform)


def _mix32(x: jax.Array) -> jax.Array:
    x = (x ^ (x >> 16)) * jnp.uint32(0x85EBCA6B)
    x = (x ^ (x >> 13)) * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def token_logprobs(logprobs: jax.Array, tokens: jax.Array, num_top: int):
    """From logprobs [R, V] and one token per row [R]: (its logprob [R], its rank [R] int32 (1 + the tokens more
    likely), the top ids [R, N] int32, their logprobs [R, N]), N = num_top. Sampled and prompt logprobs alike."""
    chosen = jnp.take_along_axis(logprobs, tokens[:, None], axis=1)[:, 0]  # [R]
    ranks = 1 + (logprobs > chosen[:, None]).sum(-1, dtype=jnp.int32)
    top_logprobs, top_ids = lax.top_k(logprobs, num_top)  # [R, N]
    return chosen, ranks, top_ids.astype(jnp.int32), top_logprobs


def _asked_ids(logprobs: jax.Array, asked: jax.Array, top_ids: jax.Array, top_logprobs: jax.Array):
    """Rows whose asked ids [R, N] start with a token: those ids and their logprobs, in their order (NO_TOKEN
    after them); the other rows keep their top-N. -> ([R, N] int32, [R, N] float32)."""
    asks = (asked[:, :1] != NO_TOKEN)  # [R, 1]
    gathered = jnp.take_along_axis(logprobs, jnp.maximum(asked, 0), axis=1)  # [R, N]
    return jnp.where(asks, asked, top_ids), jnp.where(asks, gathered, top_logprobs)


def _no_logprobs(tokens: jax.Array, top: int) -> SamplerOutput:
    rows = tokens.shape[0]
    return SamplerOutput(tokens, jnp.zeros(rows, jnp.float32), jnp.zeros(rows, jnp.int32),
                         jnp.zeros((rows, top), jnp.int32), jnp.zeros((rows, top), jnp.float32))
