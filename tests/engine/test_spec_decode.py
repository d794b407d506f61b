"""N-gram speculative decoding: proposals, verification, rollback, and outputs identical to plain decoding.

Verification samples each of a sequence's k + 1 rows with the noise plain decoding would use for that output
index (spec_decode/rejection.py), so every request, greedy or seeded or not, must generate exactly what it
generates without speculation; the tests compare whole random workloads both ways."""

from __future__ import annotations

import numpy as np
import pytest

from jaxllm.compile_counter import CompileCounter
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.sampling_params import SamplingParams
from jaxllm.spec_decode.config import SpeculativeConfig
from jaxllm.spec_decode.ngram import propose_ngram
from jaxllm.spec_decode.rejection import accept_run
from tests.engine.pool_invariants import check_pool_invariants
from tests.engine.test_warmup import MAX_MODEL_LEN, _random_params, _random_prompt

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


# ---------------------------------------------------------------------------------------------- the proposer
def _reference_proposal(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Brute force: the longest n in [min_n, max_n] whose suffix occurs earlier, its earliest occurrence."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for start in range(0, length - n):  # occurrences ending before the last token
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_ngram_proposals_match_brute_force_on_random_contexts():
    rng = np.random.RandomState(0)
    proposed = 0
    for _ in range(2000):
        tokens = rng.randint(0, int(rng.choice([2, 4, 16])), size=int(rng.randint(1, 40))).tolist()
        min_n = int(rng.randint(1, 4))
        max_n = min_n + int(rng.randint(0, 4))
        k = int(rng.randint(1, 6))
        got = propose_ngram(np.asarray(tokens, np.int32), k, min_n, max_n).tolist()
        assert got == _reference_proposal(tokens, k, min_n, max_n), (tokens, k, min_n, max_n)
        proposed += bool(got)
    assert proposed > 500  # the contexts do produce proposals


def test_ngram_prefers_the_longest_match_then_the_earliest():
    tokens = np.array([1, 2, 3, 9, 5, 3, 7, 1, 2, 3], np.int32)
    assert propose_ngram(tokens, 2, 1, 3).tolist() == [9, 5]  # "1 2 3" beats the later "3" match
    assert propose_ngram(tokens, 2, 1, 1).tolist() == [9, 5]  # n = 1: the earliest "3" (at 2)
    assert propose_ngram(np.array([4, 4, 4], np.int32), 5, 1, 2).tolist() == [4]  # overlapping the suffix
    assert propose_ngram(np.array([1, 2, 3, 4], np.int32), 3, 1, 3).tolist() == []


def test_accept_run_keeps_matches_then_the_target_token():
    assert accept_run(np.array([5, 6, 7]), np.array([5, 6, 8, 1])).tolist() == [5, 6, 8]
    assert accept_run(np.array([5, 6, 7]), np.array([5, 6, 7, 1])).tolist() == [5, 6, 7, 1]  # the bonus token
    assert accept_run(np.array([5, 6, 7]), np.array([4, 6, 7, 1])).tolist() == [4]


# ---------------------------------------------------------------------------------------------- the config
@pytest.mark.parametrize("fields, message", [
    ({"method": "ngram"}, "num_speculative_tokens is required"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be >= 1"),
    ({"method": "ngram", "num_speculative_tokens": "4"}, "num_speculative_tokens must be an integer"),
    ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "prompt_lookup_min=4 must be <= prompt_lookup_max=2"),
    ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 0}, "prompt_lookup_max must be >= 1"),
    ({"method": "ngram", "num_speculative_tokens": 4, "draft_tensor_parallel_size": 1},
     "unknown key 'draft_tensor_parallel_size'"),
    ({"method": "draft_model", "num_speculative_tokens": 4}, "method 'draft_model' needs a model"),
    ({"method": "ngram", "model": "/models/draft", "num_speculative_tokens": 4}, "goes with method 'draft_model'"),
    ({"model": 3, "num_speculative_tokens": 4}, "model must be a non-empty string"),
    ({"method": "eagle", "num_speculative_tokens": 4}, "method 'eagle' is not supported"),
])
def test_bad_speculative_configs_are_refused_naming_the_key(fields, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_dict(fields)
    with pytest.raises(ValueError, match=message):
        EngineArgs(speculative_config=fields)


def test_prompt_lookup_defaults_are_vllms():
    assert SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3}).prompt_lookup_min == 5
    config = SpeculativeConfig.from_dict({"model": "[ngram]", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    assert (config.method, config.prompt_lookup_min, config.prompt_lookup_max) == ("ngram", 4, 4)
    assert SpeculativeConfig.from_dict(None) is None
    config = SpeculativeConfig.from_dict({"model": "/models/draft", "num_speculative_tokens": 3})
    assert (config.method, config.model) == ("draft_model", "/models/draft")


def test_the_server_flag_parses_and_refuses(capsys):
    from jaxllm.entrypoints.cli import build_parser
    parser = build_parser("serve")
    args = parser.parse_args(["serve", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'])
    assert EngineArgs.from_cli_args(args).speculative_config == {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--speculative-config", '{"method": "draft_model", "num_speculative_tokens": 2}'])
    assert "method 'draft_model' needs a model" in capsys.readouterr().err
    args = parser.parse_args(["serve", "--speculative-config", '{"model": "draft", "num_speculative_tokens": 2}'])
    assert SpeculativeConfig.from_dict(EngineArgs.from_cli_args(args).speculative_config).model == "draft"


# ---------------------------------------------------------------------------------------------- the engine
def _engine(model, speculative, **settings) -> LLMEngine:
    defaults = dict(max_model_len=MAX_MODEL_LEN, block_size=8, max_num_seqs=4, max_num_batched_tokens=32,
                    num_gpu_blocks=32)
    return LLMEngine(EngineArgs(model=str(model), speculative_config=speculative, **{**defaults, **settings}))


def _run_workload(engine: LLMEngine, seed: int, num_requests: int = 30) -> dict:
    """A seeded random workload (every kind of sampling parameters, prefix hits, aborts at fixed steps);
    the finished outputs' token ids and finish reasons by request id, checking the pool after every step."""
    rng = np.random.RandomState(seed)
    shared = rng.randint(3, 49152, size=MAX_MODEL_LEN).tolist()
    results, aborted = {}, set()

    def step():
        for output in engine.step():
            if output.finished:
                results[output.request_id] = [(c.token_ids, c.text, c.finish_reason) for c in output.outputs]
        _check_rollback(engine)

    for i in range(num_requests):
        prompt = _random_prompt(rng, shared)
        if rng.rand() < 0.3:  # repetitive prompts: proposals that match
            prompt = (rng.randint(3, 49152, size=int(rng.randint(2, 6))).tolist() * 8)[:MAX_MODEL_LEN // 2]
        params = _random_params(rng)
        length = len(prompt) if isinstance(prompt, list) else 30
        if params.max_tokens + length > MAX_MODEL_LEN:
            params.max_tokens = max(1, MAX_MODEL_LEN - length - 1)
            params.min_tokens = min(params.min_tokens, params.max_tokens)
        engine.add_request(str(i), prompt, params)
        for _ in range(int(rng.randint(0, 10))):  # the queue drains at times: rows free for proposals
            step()
        if rng.rand() < 0.15:  # chosen from the requests added, not those unfinished (timing differs)
            victim = str(rng.randint(i + 1))
            engine.abort_request(victim)
            aborted.add(victim)
    while engine.has_unfinished_requests():
        step()
    pool = engine.scheduler.kv_cache.pool
    assert pool.num_free_blocks == pool.num_usable_blocks  # every block back: none leaked by a rollback
    return {rid: out for rid, out in results.items() if rid not in aborted}


def _check_rollback(engine: LLMEngine) -> None:
    """The pool's bookkeeping, and no block registered in the prefix cache past a request's verified tokens."""
    manager = engine.scheduler.kv_cache
    check_pool_invariants(manager.pool, manager.block_tables())
    for request in engine.scheduler.running:
        registered = manager._num_registered.get(request.request_id, 0)
        verified = min(request.num_computed_tokens, request.num_tokens)
        assert registered * manager.block_size <= verified, request.request_id


@pytest.mark.slow
@pytest.mark.parametrize("settings", [
    dict(max_num_seqs=4, max_num_batched_tokens=32, num_gpu_blocks=32),  # small pool: preemption
    dict(max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks=96),
    dict(max_num_seqs=6, max_num_batched_tokens=16, num_gpu_blocks=48, async_scheduling=False),  # chunked
    dict(max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks=96, enable_prefix_caching=False),
], ids=["preemption", "batch-8", "batch-6-chunked-sync", "no-prefix-cache"])
def test_random_workload_generates_the_same_with_and_without_speculation(tiny_model_with_tokenizer, settings):
    plain = _run_workload(_engine(tiny_model_with_tokenizer, None, **settings), seed=3)
    engine = _engine(tiny_model_with_tokenizer, NGRAM, **settings)
    speculated = _run_workload(engine, seed=3)
    assert speculated == plain
    stats = engine.stats()
    assert stats["spec_decode_num_accepted_tokens"] > 20 and stats["spec_decode_num_drafts"] > 20, stats
    assert stats["spec_decode_num_draft_tokens"] > stats["spec_decode_num_accepted_tokens"]  # rejections too
    assert sum(stats["spec_decode_num_accepted_tokens_per_pos"]) == stats["spec_decode_num_accepted_tokens"]


@pytest.mark.slow
def test_after_warmup_speculation_compiles_nothing(tiny_model_with_tokenizer):
    engine = _engine(tiny_model_with_tokenizer, NGRAM, warmup=True)
    with CompileCounter() as compiles:
        _run_workload(engine, seed=5, num_requests=20)
    assert compiles.count == 0, compiles.events
    assert engine.stats()["spec_decode_num_drafts"] > 0


# ---------------------------------------------------------------------------------------------- random sampling
TEMPERATURE = 0.15


def _next_token_probs(loaded, forward, tokens: list[int]) -> np.ndarray:
    """[V] the model's next-token distribution after `tokens` at TEMPERATURE (one plain forward)."""
    from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache
    from jaxllm.model.params import params_dtype
    block_size = 16
    table = [1, 2, 3]
    kv = init_kv_cache(loaded.config, 4, block_size, params_dtype(loaded.params))
    batch = build_step_batch([SequenceChunk(tokens, 0, table)], block_size, num_tokens=48, max_blocks=3)
    logits, _ = forward(loaded.params, kv, batch)
    z = np.asarray(logits[0], np.float64) / TEMPERATURE
    p = np.exp(z - z.max())
    return p / p.sum()


def _looping_context(model, loaded) -> tuple[list[int], int, int, np.ndarray, np.ndarray]:
    """(prompt, g, d, p0, p1): a random tiny model decoding greedily falls into a loop, so after a prompt that ends
    inside the loop its likely next token g is followed by the n-gram proposal d (the loop's next token); p0 is
    the distribution after prompt + g, p1 the one after prompt + g + d, and the two differ (TV >= 0.3)."""
    from jaxllm.llm import LLM
    from jaxllm.model import jit_forward
    llm = LLM(str(model), skip_tokenizer=True, max_model_len=64, block_size=4)
    forward = jit_forward(loaded.config)
    rng = np.random.RandomState(0)
    for _ in range(60):
        start = rng.randint(3, 256, size=4).tolist()
        greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, detokenize=False)
        loop = start + llm.generate([{"prompt_token_ids": start}], greedy, use_tqdm=False)[0].outputs[0].token_ids
        prompt, g = loop[:-2], loop[-2]
        d = propose_ngram(np.asarray(prompt + [g], np.int32), 1, 1, 3).tolist()
        if not d:
            continue
        p0 = _next_token_probs(loaded, forward, prompt + [g])
        p1 = _next_token_probs(loaded, forward, prompt + [g, d[0]])
        if _next_token_probs(loaded, forward, prompt)[g] >= 0.3 and p0[d[0]] >= 0.3 and \
                0.5 * np.abs(p0 - p1).sum() >= 0.3:
            return prompt, g, d[0], p0, p1
    raise AssertionError("no looping context found")


def _chi_square_pvalue(samples: list[int], probs: np.ndarray) -> float:
    """Pearson's test of `samples` against `probs` [V]; tokens expected fewer than 5 times share one bin."""
    from scipy.stats import chisquare
    counts = np.bincount(np.asarray(samples, np.int64), minlength=len(probs)).astype(np.float64)
    expected = probs * len(samples)
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    keep = expected > 0
    return float(chisquare(observed[keep], expected[keep]).pvalue)


@pytest.mark.slow
def test_random_sampling_with_speculation_follows_the_target_distribution(tiny_model_dir):
    """Seeded requests sample three tokens t1 t2 t3 after a looping context: t1 comes from the prefill; when it
    is g, the next step verifies the proposal d: t2 comes from the row after g and, when t2 = d (accepted), t3
    from the row after d. Those must follow p(. | prompt, g) and p(. | prompt, g, d); t3 tested against the
    former must fail (the test can tell the rows apart)."""
    from jaxllm import load_model
    from jaxllm.llm import LLM
    model = tiny_model_dir("llama3")[0]
    prompt, g, d, p0, p1 = _looping_context(model, load_model(model))
    llm = LLM(str(model), skip_tokenizer=True, max_model_len=64, block_size=4, max_num_seqs=64,
              max_num_batched_tokens=512, speculative_config={**NGRAM, "num_speculative_tokens": 2})
    seconds, thirds = [], []
    for first_seed in range(0, 1200, 24):  # 24 at a time: sampler rows left for the proposals
        params = [SamplingParams(temperature=TEMPERATURE, max_tokens=3, seed=seed, ignore_eos=True,
                                 detokenize=False) for seed in range(first_seed, first_seed + 24)]
        for output in llm.generate([{"prompt_token_ids": prompt}] * 24, params, use_tqdm=False):
            t1, t2, t3 = output.outputs[0].token_ids
            if t1 == g:
                seconds.append(t2)
                if t2 == d:
                    thirds.append(t3)
    stats = llm.engine.stats()
    assert stats["spec_decode_num_drafts"] >= len(seconds) and len(thirds) > 150, (stats, len(thirds))
    assert _chi_square_pvalue(seconds, p0) > 0.001
    assert _chi_square_pvalue(thirds, p1) > 0.001
    assert _chi_square_pvalue(thirds, p0) < 1e-6  # the wrong row's distribution is rejected
