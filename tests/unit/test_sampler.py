"""Sampler: exact masks and penalties against numpy references, seeded reproducibility, distributions, variants."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.compile_counter import CompileCounter
from jaxllm.sampler import (BISECT_ROWS, NUM_CANDIDATES, apply_adjustments, apply_top_k_top_p_min_p,
                            count_sampled, sample)
from jaxllm.sampling_batch import (IN_PROMPT, RowSampling, SamplingRow, build_sampling_batch, empty_logit_state,
                                   pack_sampling_batch)
from jaxllm.sampling_params import MAX_BAD_WORD_LEN, MAX_LOGPROBS, SamplingParams

SAMPLE = jax.jit(sample)


def row(prompt=(1, 2), output=(), stream=0, **params) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), list(prompt), list(output), stream)


def run(logits, rows, num_rows=None, **kwargs):
    """Sample with the shared jitted sampler; returns the SamplerOutput with numpy leaves."""
    logits = np.asarray(logits, np.float32)
    batch = build_sampling_batch(rows, num_rows or logits.shape[0], logits.shape[1], **kwargs)
    return jax.tree.map(np.asarray, SAMPLE(jnp.asarray(logits), batch))


def softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x[np.isfinite(x)].max())
    return e / e.sum()


def log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def reference_filter(z, top_k, top_p, min_p):
    """vLLM's min-p, then sort-based top-k and top-p, in float64."""
    z = np.asarray(z, np.float64).copy()
    if min_p > 0:
        p = softmax(z)
        z[p < min_p * p.max()] = -np.inf
    if 0 < top_k < len(z):
        z[z < np.sort(z)[::-1][top_k - 1]] = -np.inf
    if top_p < 1:
        order = np.argsort(z, kind="stable")  # ascending, as vLLM
        drop = np.cumsum(softmax(z)[order]) <= 1 - top_p
        drop[-1] = False
        z[order[drop]] = -np.inf
    return z


def reference_adjust(logits, prompt, output, params: SamplingParams, stop_ids_masked=()):
    """logit_bias and min_tokens, then vLLM's repetition / frequency / presence penalties, in float64."""
    x = np.asarray(logits, np.float64).copy()
    for token, bias in (params.logit_bias or {}).items():
        x[token] += bias
    x[list(stop_ids_masked)] = -np.inf
    seen = np.zeros(len(x), bool)
    seen[list(prompt) + list(output)] = True
    counts = np.bincount(np.asarray(output, int), minlength=len(x))
    rep = params.repetition_penalty
    x = np.where(seen, np.where(x > 0, x / rep, x * rep), x)
    return x - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)


# Hand-made logits: by rank, probabilities .405 .245 .149 .090 .055 .033 .020 .003, placed in shuffled slots.
RANKED = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
SLOTS = np.array([5, 2, 7, 0, 3, 6, 1, 4])  # rank r lives at token SLOTS[r]
HAND_LOGITS = np.empty(8)
HAND_LOGITS[SLOTS] = RANKED

MASK_CASES = [  # (top_k, top_p, min_p, ranks kept), worked out by hand from the probabilities above
    (3, 1.0, 0.0, {0, 1, 2}),
    (0, 0.5, 0.0, {0, 1}),
    (0, 0.9, 0.0, {0, 1, 2, 3, 4}),
    (0, 1.0, 0.2, {0, 1, 2, 3}),
    (2, 0.5, 0.0, {0}),
    (5, 0.8, 0.1, {0, 1, 2}),
    (1, 1.0, 0.0, {0}),
    (8, 1.0, 0.0, set(range(8))),
]


@pytest.mark.parametrize("top_k, top_p, min_p, ranks", MASK_CASES)
def test_masks_exact_on_hand_made_logits(top_k, top_p, min_p, ranks):
    expected = set(SLOTS[sorted(ranks)].tolist())
    masked = np.asarray(apply_top_k_top_p_min_p(jnp.asarray(HAND_LOGITS[None], jnp.float32), jnp.array([top_k]),
                                                jnp.array([top_p], jnp.float32), jnp.array([min_p], jnp.float32)))[0]
    assert set(np.flatnonzero(np.isfinite(masked)).tolist()) == expected
    np.testing.assert_array_equal(masked[list(expected)], HAND_LOGITS[list(expected)].astype(np.float32))
    assert set(np.flatnonzero(np.isfinite(reference_filter(HAND_LOGITS, top_k, top_p, min_p))).tolist()) == expected
    # The tokens ever sampled over 2000 seeds are exactly the kept ones (the least likely has p >= 0.05 here).
    n = 2000
    params = dict(top_k=top_k, top_p=top_p, min_p=min_p)
    out = run(np.tile(HAND_LOGITS, (n, 1)), [row(seed=s, **params) for s in range(n)])
    assert set(out.sampled_token_ids.tolist()) == expected


def test_masks_match_reference_on_large_rows_including_bisection():
    """V = 4096 > NUM_CANDIDATES: flat rows with top-p, and top_k > NUM_CANDIDATES, need bisection (in rounds)."""
    rng = np.random.RandomState(0)
    num_rows, vocab = 96, 4096
    scales = rng.choice([0.3, 1.0, 4.0], num_rows)
    z = (rng.randn(num_rows, vocab) * scales[:, None]).astype(np.float32)
    top_k = rng.choice([0, 0, 1, 7, 50, NUM_CANDIDATES + 44, 1000], num_rows)
    top_p = rng.choice([1.0, 0.3, 0.9, 0.99], num_rows)
    min_p = rng.choice([0.0, 0.0, 0.0, 0.05, 0.5], num_rows)
    args = (z, top_k.astype(np.int32), top_p.astype(np.float32), min_p.astype(np.float32))
    got = np.asarray(jax.jit(apply_top_k_top_p_min_p)(*map(jnp.asarray, args)))
    kept = []
    for i in range(num_rows):
        want = reference_filter(z[i], top_k[i], top_p[i], min_p[i])
        np.testing.assert_array_equal(np.isfinite(got[i]), np.isfinite(want), err_msg=f"row {i}")
        kept.append(np.isfinite(want).sum())
    kept = np.array(kept)
    assert (kept > NUM_CANDIDATES).sum() > BISECT_ROWS and (kept < NUM_CANDIDATES).sum() > 10  # 2+ rounds


def test_greedy_is_argmax_including_mixed_batches():
    rng = np.random.RandomState(1)
    logits = rng.randn(6, 300).astype(np.float32)
    out = run(logits, [row(temperature=0.0) for _ in range(4)], num_rows=6)
    np.testing.assert_array_equal(out.sampled_token_ids[:4], logits[:4].argmax(-1))
    mixed = [row(temperature=0.0), row(temperature=1.0, top_k=5), row(temperature=0.0, seed=3)]
    out = run(logits[:3], mixed)
    np.testing.assert_array_equal(out.sampled_token_ids[[0, 2]], logits[[0, 2]].argmax(-1))
    assert out.sampled_token_ids[1] in np.argsort(logits[1])[-5:]


def test_penalties_bias_and_min_tokens_match_reference():
    rng = np.random.RandomState(2)
    vocab, eos = 64, 3
    logits = rng.randn(5, vocab).astype(np.float32) * 3
    cases = [  # (prompt, output, params, ids masked by min_tokens)
        ([5, 6, 6, 7], [7, 8, 8, 8, 9], SamplingParams(repetition_penalty=1.7), ()),
        ([5, 6], [10, 10, 11], SamplingParams(frequency_penalty=0.6, presence_penalty=-0.4), ()),
        ([1, 2, 3], [4, 4, 2], SamplingParams(repetition_penalty=0.7, frequency_penalty=-1.0,
                                              presence_penalty=1.5, logit_bias={4: 2.5, 60: -7.0}), ()),
        ([9], [12], SamplingParams(min_tokens=3, stop_token_ids=[20, 21], logit_bias={21: 5.0}), (20, 21, eos)),
        ([9], [12, 13, 14], SamplingParams(min_tokens=3, stop_token_ids=[20]), ()),
    ]
    rows = [SamplingRow(p, prompt, output) for prompt, output, p, _ in cases]
    batch = build_sampling_batch(rows, 5, vocab, eos_token_ids=[eos])
    got = np.asarray(jax.jit(apply_adjustments)(jnp.asarray(logits), batch, batch.state))
    for i, (prompt, output, params, masked) in enumerate(cases):
        np.testing.assert_allclose(got[i], reference_adjust(logits[i], prompt, output, params, masked),
                                   rtol=1e-6, atol=1e-6, err_msg=f"case {i}")


def reference_ban(logits, output, bad_words_token_ids):
    """vLLM's bad_words: a word's last token is -inf when the output ends with the rest of the word."""
    x = np.array(logits, np.float64)
    for word in bad_words_token_ids:
        prefix = list(word[:-1])
        if len(prefix) <= len(output) and list(output[len(output) - len(prefix):]) == prefix:
            x[word[-1]] = -np.inf
    return x


class DigitsTokenizer:
    """Stands for a tokenizer in bad_words tests: the text "5 9 8" is the tokens [5, 9, 8]."""

    @staticmethod
    def encode(text, add_special_tokens=True):
        return [int(t) for t in text.split()]


def with_bad_words(params, words):
    """params with bad_words given as token sequences (DigitsTokenizer's texts)."""
    params.bad_words = [" ".join(map(str, word)) for word in words]
    params.update_from_tokenizer(DigitsTokenizer())
    assert params.bad_words_token_ids == words
    return params


def test_bad_words_match_reference():
    """Single-token words always, longer ones only right after their prefix; a word longer than the output
    so far, or whose prefix only appears earlier, bans nothing; the longest word the state holds works."""
    rng = np.random.RandomState(4)
    vocab = 64
    longest = list(range(40, 40 + MAX_BAD_WORD_LEN))
    cases = [  # (output, bad words)
        ([], [[7], [8, 9]]),
        ([5, 8], [[7], [8, 9], [5, 8, 10], [6, 8, 11]]),
        ([8, 1], [[8, 9], [2, 8, 12]]),
        (longest[:-1], [longest, longest[1:]]),
        ([1, 2, 3] + longest[:-1], [longest, [3, 40, 13]]),
        ([3], [[1, 2, 3, 4]]),
    ]
    logits = rng.randn(len(cases), vocab).astype(np.float32)
    rows = [SamplingRow(with_bad_words(SamplingParams(temperature=0.0), words), [1], output)
            for output, words in cases]
    batch = build_sampling_batch(rows, len(cases), vocab)
    got = np.asarray(jax.jit(apply_adjustments)(jnp.asarray(logits), batch, batch.state))
    for i, (output, words) in enumerate(cases):
        want = reference_ban(logits[i], output, words)
        np.testing.assert_array_equal(np.isinf(got[i]), np.isinf(want), err_msg=f"case {i}")
        np.testing.assert_allclose(got[i][np.isfinite(want)], want[np.isfinite(want)], rtol=1e-6)
    assert np.isinf(got).sum() == 1 + 3 + 0 + 1 + 1 + 0


def test_logit_bias_and_min_tokens_steer_greedy():
    logits = np.zeros((3, 10), np.float32)
    logits[:, 0], logits[:, 4], logits[:, 7] = 5.0, 4.0, 3.0  # 0 = EOS, 4 = a stop token
    rows = [row(temperature=0.0, logit_bias={9: 6.0}),
            row(temperature=0.0, min_tokens=3, stop_token_ids=[4], output=[1]),
            row(temperature=0.0, min_tokens=3, stop_token_ids=[4], output=[1, 1, 1])]
    out = run(logits, rows, eos_token_ids=[0])
    assert out.sampled_token_ids.tolist() == [9, 7, 0]


def test_counts_on_the_device_equal_rows_built_from_the_whole_history():
    """The engine writes a request's rows once, then the sampler counts each sampled token into its slot; the
    state and the packed rows equal those built from the whole history, step after step."""
    vocab = 40
    params = SamplingParams(temperature=0.7, frequency_penalty=0.4, presence_penalty=-0.3, repetition_penalty=1.2,
                            logit_bias={3: 2.0}, min_tokens=5, stop_token_ids=[7], seed=11)
    prompt, output = [1, 2, 2, 30], [5, 5, 9, 5, 12, 39] + list(range(10, 10 + MAX_BAD_WORD_LEN))
    with_bad_words(params, [[5, 9, 8], [4]])
    incremental = RowSampling(params, 0, vocab, eos_token_ids=[0])
    incremental.slot = 0
    state = empty_logit_state(2, vocab)
    for table, values in zip(jax.tree.leaves(state), jax.tree.leaves(incremental.state_rows(prompt, []))):
        table[0] = values
    count = jax.jit(count_sampled)
    for step in range(len(output) + 1):
        built = build_sampling_batch([SamplingRow(params, prompt, output[:step])],
                                     2, vocab, eos_token_ids=[0])
        packed = pack_sampling_batch([incremental], 2, neutral_slot=2).replace(state=state)
        for got, want in zip(jax.tree.leaves(packed), jax.tree.leaves(built)):
            np.testing.assert_array_equal(got, want)
        if step < len(output):
            incremental.expect_token()
            state = jax.tree.map(np.asarray, count(state, packed, jnp.array([output[step], 0], jnp.int32)))


@pytest.mark.parametrize("requested", [None, 0, 7])
def test_logprobs_come_from_raw_logits(requested):
    rng = np.random.RandomState(3)
    logits = rng.randn(4, 200).astype(np.float32) * 2
    rows = [row(temperature=0.0, logprobs=requested), row(temperature=0.5, repetition_penalty=1.5, top_k=4, seed=1),
            row(temperature=1.3, logit_bias={7: 9.0}, seed=2)]
    out = run(logits, rows, num_rows=4)
    if requested is None:  # fixed output shapes; nothing computed
        assert not out.sampled_logprobs.any() and not out.top_logprobs.any()
        return
    bucket = MAX_LOGPROBS  # every row gets the top MAX_LOGPROBS; a request keeps its own count of them
    want = log_softmax(logits)
    tokens = out.sampled_token_ids
    np.testing.assert_allclose(out.sampled_logprobs, want[np.arange(4), tokens], atol=1e-5)
    np.testing.assert_array_equal(out.sampled_ranks, 1 + (want > want[np.arange(4), tokens][:, None]).sum(-1))
    assert out.top_logprobs.shape == out.top_logprob_token_ids.shape == (4, bucket)
    np.testing.assert_array_equal(out.top_logprob_token_ids, np.argsort(-want, axis=-1, kind="stable")[:, :bucket])
    np.testing.assert_allclose(out.top_logprobs, np.sort(want, -1)[:, ::-1][:, :bucket], atol=1e-5)


def test_logprob_token_ids_replace_the_top_n_of_their_row_only():
    """A row with logprob_token_ids reports those ids' raw logprobs, in their order, where the others report
    their top-N; ids outside the top-N and a logit bias on the row change nothing of that."""
    rng = np.random.RandomState(5)
    logits = rng.randn(3, 200).astype(np.float32)
    asked = [150, 3, 77]
    rows = [row(temperature=0.0, logprobs=2, logprob_token_ids=asked, logit_bias={3: 50.0}),
            row(temperature=0.0, logprobs=2), row(temperature=0.7, seed=4, logprobs=0)]
    out = run(logits, rows)
    want = log_softmax(logits)
    np.testing.assert_array_equal(out.top_logprob_token_ids[0][:3], asked)
    np.testing.assert_allclose(out.top_logprobs[0][:3], want[0, asked], atol=1e-5)
    assert out.sampled_token_ids[0] == 3  # sampled with the bias; its logprob is still the raw one
    np.testing.assert_allclose(out.sampled_logprobs[0], want[0, 3], atol=1e-5)
    for r in (1, 2):
        np.testing.assert_array_equal(out.top_logprob_token_ids[r], np.argsort(-want[r], kind="stable")[:MAX_LOGPROBS])


@pytest.mark.parametrize("ids, message", [
    ([], "logprob_token_ids must be a list of 1 to 20 token ids"),
    (list(range(21)), "logprob_token_ids must be a list of 1 to 20 token ids"),
    ([4, 4], "logprob_token_ids must not repeat a token id"),
    ([-1], "logprob_token_ids must be an int >= 0"),
])
def test_bad_logprob_token_ids_are_named(ids, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SamplingParams(logprobs=1, logprob_token_ids=ids)
    with pytest.raises(ValueError, match="logprob_token_ids needs logprobs"):
        SamplingParams(logprob_token_ids=[4])


def seeded_tokens(sample_fn, position, num_rows, neighbours, steps=6):
    """Tokens of a seed=1234 request over `steps` steps, placed at `position` among `neighbours`."""
    vocab = 1000
    tokens = []
    for step in range(steps):
        rows = list(neighbours)
        rows.insert(position, row(prompt=[4, 5, 6], output=[9] * step, seed=1234, temperature=0.9))
        batch = build_sampling_batch(rows, num_rows, vocab, base_seed=77)
        out = sample_fn(jnp.zeros((num_rows, vocab), jnp.float32), batch)
        tokens.append(int(out.sampled_token_ids[position]))
    return tokens


@pytest.mark.slow
def test_seeded_request_reproducible_across_batches_and_runs():
    alone = seeded_tokens(SAMPLE, 0, 1, [])
    assert len(set(alone)) > 1  # a fresh draw every step
    crowded = [row(temperature=0.0), row(seed=5, top_k=3, logprobs=2), row(stream=8, repetition_penalty=1.2,
                                                                            output=[1, 2])]
    assert seeded_tokens(SAMPLE, 2, 8, crowded) == alone
    assert seeded_tokens(jax.jit(sample), 1, 4, crowded[:1]) == alone  # a fresh compilation
    other_seed = [int(SAMPLE(jnp.zeros((1, 1000)), build_sampling_batch([row(seed=4321, output=[9] * s)], 1, 1000))
                      .sampled_token_ids[0]) for s in range(6)]
    assert other_seed != alone


def test_unseeded_requests_differ():
    vocab, n = 1000, 16
    rows = [row(stream=i) for i in range(n)]
    first = run(np.zeros((n, vocab)), rows, base_seed=0).sampled_token_ids
    assert len(set(first.tolist())) >= n - 2
    again = run(np.zeros((n, vocab)), rows, base_seed=0).sampled_token_ids
    np.testing.assert_array_equal(first, again)  # the engine's base seed makes runs repeatable
    other_base = run(np.zeros((n, vocab)), rows, base_seed=1).sampled_token_ids
    assert (other_base != first).sum() >= n - 2


@pytest.mark.parametrize("params, keep", [(dict(temperature=0.8), 6), (dict(temperature=1.5, top_k=3), 3)])
def test_sampling_frequencies_match_softmax(params, keep):
    logits = np.array([1.0, 0.5, 0.0, -0.5, -1.0, 0.3])
    n = 20000
    out = run(np.tile(logits, (n, 1)), [row(seed=s, **params) for s in range(n)])
    z = logits / params["temperature"]
    z[np.argsort(z)[:len(z) - keep]] = -np.inf
    expected = softmax(z) * n
    observed = np.bincount(out.sampled_token_ids, minlength=len(logits))
    assert observed[expected == 0].sum() == 0
    chi2 = ((observed - expected)[expected > 0] ** 2 / expected[expected > 0]).sum()
    assert chi2 < 30, (observed, expected.round())  # keep - 1 degrees of freedom; p < 1e-4 at 30


def test_padded_rows_produce_no_nan():
    vocab = 50
    rows = [row(top_p=0.5, top_k=3, min_p=0.1, logprobs=5, seed=1, repetition_penalty=2.0, output=[1, 1]),
            row(temperature=0.0, logit_bias={3: -100.0}, min_tokens=4, stop_token_ids=[2])]
    logits = np.zeros((8, vocab), np.float32)
    logits[:2] = np.random.RandomState(4).randn(2, vocab)
    out = run(logits, rows, num_rows=8, eos_token_ids=[0])
    for leaf in jax.tree.leaves(out):
        assert np.isfinite(leaf).all()
    assert ((out.sampled_token_ids >= 0) & (out.sampled_token_ids < vocab)).all()


def test_host_batch_padding_and_adjustments():
    vocab = 500
    plain = build_sampling_batch([row(), row(temperature=0.0)], 4, vocab)
    assert plain.state is None and not plain.wants_logprobs
    assert plain.is_greedy.tolist() == [False, True, True, True] and plain.temperature.tolist() == [1.0] * 4
    assert build_sampling_batch([row(), row(logprobs=0)], 2, vocab).wants_logprobs
    long_prompt = build_sampling_batch([row(prompt=range(40), repetition_penalty=1.1), row(top_k=vocab)], 2, vocab)
    state = long_prompt.state  # one slot per row, then the neutral slot
    assert state.bias.shape == state.token_flags.shape == state.output_counts.shape == (3, vocab)
    assert long_prompt.top_k.tolist() == [0, 0]  # top_k >= vocab size is no filter
    assert long_prompt.slot.tolist() == [0, 2]  # the second row needs no slot: the neutral one
    assert np.flatnonzero(state.token_flags[0] & IN_PROMPT).tolist() == list(range(40))
    assert not state.token_flags[1:].any() and not state.output_counts.any() and not state.bias.any()
    assert long_prompt.repetition_penalty.tolist() == pytest.approx([1.1, 1.0])
    done = build_sampling_batch([row(min_tokens=2, output=[5, 6], stop_token_ids=[9])], 1, vocab, eos_token_ids=[0])
    assert done.state is None
    with pytest.raises(ValueError, match="3 rows do not fit in num_rows=2"):
        build_sampling_batch([row()] * 3, 2, vocab)


def test_one_compiled_program_serves_every_mix():
    """For a given [R, V], with an empty LogitState standing in when no row has adjustments (the engine's runner
    always passes its state): one program, whatever the rows ask, and the empty state changes nothing."""
    sample_fn = jax.jit(lambda logits, batch: sample(logits, batch))  # a fresh function: its own cache
    vocab, num_rows = 300, 4
    logits = jnp.asarray(np.random.RandomState(5).randn(num_rows, vocab), jnp.float32)
    compositions = [[row(temperature=0.0)], [row(temperature=0.7, seed=3), row(temperature=0.0)], [row(top_p=0.9)],
                    [row(top_k=5, seed=1), row(min_p=0.2)], [row(temperature=0.0, logprobs=1)],
                    [row(logprobs=20), row(temperature=0.0, logprobs=0)],
                    [row(temperature=0.0, repetition_penalty=1.3)], [row(logit_bias={3: 1.0}, logprobs=2)],
                    [row(temperature=0.0, frequency_penalty=0.5, prompt=range(50), top_k=3)]]
    batches = [build_sampling_batch(rows, num_rows, vocab) for rows in compositions]
    with_neutral = [b if b.state is not None else b.replace(state=empty_logit_state(num_rows, vocab))
                    for b in batches]
    with CompileCounter() as compiles:
        outs = [sample_fn(logits, batch) for batch in with_neutral]
    assert compiles.count == 1
    for batch, out in zip(batches, outs):
        if batch.state is None:  # the same tokens as without any adjustments
            np.testing.assert_array_equal(out.sampled_token_ids, SAMPLE(logits, batch).sampled_token_ids)


def reference_bitmask_allowed(bitmask: np.ndarray, vocab: int) -> np.ndarray:
    """[R, W] int32 words -> [R, V] bool: token t allowed where bit t % 32 of word t // 32 is set."""
    words = bitmask.astype(np.int64) & 0xFFFFFFFF
    return np.array([[(words[r, t // 32] >> (t % 32)) & 1 == 1 for t in range(vocab)] for r in range(len(words))])


@pytest.mark.parametrize("vocab", [32, 70, 1000])
def test_token_bitmask_masks_exactly_the_disallowed_tokens(vocab):
    """Greedy rows take the best allowed token, sampled rows never take a disallowed one, logprobs are over the
    allowed tokens (vLLM's order: the bitmask before everything), unconstrained rows (all bits) are unchanged,
    and a batch whose has_bitmask is False ignores the bitmask."""
    rng = np.random.RandomState(vocab)
    width = -(-vocab // 32)
    num_rows = 6
    logits = rng.randn(num_rows, vocab).astype(np.float32) * 3
    bitmask = rng.randint(-2**31, 2**31, size=(num_rows, width), dtype=np.int64).astype(np.int32)
    bitmask[5] = -1  # an unconstrained row
    allowed = reference_bitmask_allowed(bitmask, vocab)
    rows = [row(temperature=0.0, logprobs=3), row(temperature=1.0, seed=1, logprobs=3), row(temperature=0.5),
            row(temperature=0.0, repetition_penalty=1.5, prompt=range(20)), row(temperature=2.0, top_k=5),
            row(temperature=0.0, logprobs=3)]
    batch = build_sampling_batch(rows, num_rows, vocab).replace(token_bitmask=jnp.asarray(bitmask),
                                                                has_bitmask=np.asarray(True))
    for _ in range(5):
        out = jax.tree.map(np.asarray, SAMPLE(jnp.asarray(logits), batch))
        assert allowed[np.arange(num_rows), out.sampled_token_ids].all()
        batch = batch.replace(rng_counter=batch.rng_counter + 1)
    masked = np.where(allowed, logits, -np.inf)
    assert out.sampled_token_ids[0] == masked[0].argmax() and out.sampled_token_ids[5] == logits[5].argmax()
    np.testing.assert_allclose(out.sampled_logprobs[0], log_softmax(masked[0])[masked[0].argmax()], rtol=1e-5)
    unconstrained = jax.tree.map(np.asarray, SAMPLE(jnp.asarray(logits), batch.replace(has_bitmask=np.asarray(False))))
    reference = run(logits, rows)
    np.testing.assert_array_equal(unconstrained.sampled_token_ids[[0, 3, 5]], reference.sampled_token_ids[[0, 3, 5]])
