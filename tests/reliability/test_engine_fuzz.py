"""The engine through its Python API under a random workload, checked after every step.

A tiny random-weight Llama with the default model's tokenizer; a small batch (6 sequences), a small token budget
(chunked prefill) and a KV pool of 27 blocks of 8 tokens, so requests queue, prefill in chunks and get preempted.
Requests come from a catalogue of specs: prompts built on three shared stems (prefix-cache hits) and every
sampling feature (greedy, seeded sampling with top_k / top_p / min_p, penalties, logit_bias, min_tokens, stop
strings, stop token ids, logprobs, prompt_logprobs, n > 1, best_of > n), plus unseeded sampling. Each spec first
runs alone on the idle engine: its solo output is the reference.

Then JAXLLM_ENGINE_FUZZ_STEPS engine steps (CI default 3000; 10,000 or more for a thorough run) with random
arrivals (a random output kind each, sometimes reusing the id of a request that ended), random aborts, and a
drain every DRAIN_EVERY steps. After every step: check_pool_invariants with the KV cache manager's block
tables, block tables held exactly by the running requests and covering their computed tokens, and every cached
block's hash equal to the hash of the tokens the request holding it has there. At every drain and at the end:
all blocks free. Every request that was not aborted must equal its solo run (greedy and seeded sampling do not
depend on the batch); an aborted one's output so far is a prefix of it; unseeded ones only keep their limits.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import time

import pytest

from jaxllm.engine.args import EngineArgs
from jaxllm.engine.block_pool import BlockPool
from jaxllm.engine.engine import LLMEngine
from jaxllm.engine.kv_cache_manager import hash_block
from jaxllm.sampling_params import SamplingParams
from tests.engine.pool_invariants import check_pool_invariants

# About 60 steps/s on a 2-core CPU, checks included: the default 3000 take ~50 s, after ~20 s of solo runs that
# also compile the programs.
STEPS = int(os.environ.get("JAXLLM_ENGINE_FUZZ_STEPS", "3000"))
SEED = int(os.environ.get("JAXLLM_ENGINE_FUZZ_SEED", "0"))
DRAIN_EVERY = 1000
BLOCK_SIZE = 8
NUM_BLOCKS = 28  # 27 usable: 6 running requests of up to 11 blocks each do not fit
ENGINE = dict(max_model_len=128, max_num_seqs=6, max_num_batched_tokens=32, block_size=BLOCK_SIZE,
              num_gpu_blocks=NUM_BLOCKS, warmup=False)
MAX_LIVE = 12  # requests added and not yet ended: beyond max_num_seqs, some wait
ARRIVAL_P, ABORT_P, REUSE_ID_P = 0.4, 0.03, 0.2
FIRST_TOKEN = 20  # prompt tokens are drawn from [FIRST_TOKEN, vocab): no special tokens
NUM_BASE_SPECS = 44
LOGPROB_TOLERANCE = 1e-4  # logprob values may differ in the last bits with the batch's shape; tokens may not


@dataclasses.dataclass(frozen=True)
class Spec:
    """One request's prompt and sampling parameters (hashable: the key of its solo result). `compared`: its output
    must equal its solo run's."""

    feature: str
    prompt: tuple[int, ...]
    params: tuple[tuple[str, object], ...]  # SamplingParams keyword arguments, lists as tuples
    compared: bool = True

    @classmethod
    def of(cls, feature: str, prompt, params: dict, compared: bool = True) -> "Spec":
        frozen = {k: tuple(sorted(v.items())) if isinstance(v, dict) else tuple(v) if isinstance(v, list) else v
                  for k, v in params.items()}
        return cls(feature, tuple(prompt), tuple(sorted(frozen.items())), compared)

    @property
    def kwargs(self) -> dict:
        return {k: dict(v) if k == "logit_bias" else list(v) if isinstance(v, tuple) else v for k, v in self.params}

    def sampling_params(self) -> SamplingParams:
        """A fresh SamplingParams (it normalises its fields in place)."""
        return SamplingParams(**self.kwargs)

    def derive(self, feature: str, **changes) -> "Spec":
        return Spec.of(feature, self.prompt, {**self.kwargs, **changes}, self.compared)

    @property
    def ranked(self) -> bool:
        return (self.kwargs.get("best_of") or 1) > self.kwargs.get("n", 1)


@dataclasses.dataclass
class Sample:
    tokens: list = dataclasses.field(default_factory=list)
    text: str = ""
    logprobs: list = dataclasses.field(default_factory=list)
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: object = None


@dataclasses.dataclass
class Result:
    """What a request reported, assembled from its outputs of any kind."""

    samples: dict = dataclasses.field(default_factory=dict)  # completion index -> Sample
    prompt_logprobs: list | None = None
    finished: bool = False

    def absorb(self, output, kind: str) -> None:
        for completion in output.outputs:
            sample = self.samples.setdefault(completion.index, Sample())
            if kind != "delta":
                sample.tokens, sample.text, sample.logprobs = [], "", []
            sample.tokens += completion.token_ids
            sample.text += completion.text
            sample.logprobs += completion.logprobs or []
            sample.cumulative_logprob = completion.cumulative_logprob
            sample.finish_reason, sample.stop_reason = completion.finish_reason, completion.stop_reason
        self.prompt_logprobs = output.prompt_logprobs
        self.finished = output.finished


# ------------------------------------------------------------------------------------------------ the catalogue
def make_prompts(rng: random.Random, vocab: int, count: int) -> list[tuple[int, ...]]:
    """Prompts built on three stems: many share whole blocks with others (prefix-cache hits)."""
    stems = [[rng.randrange(FIRST_TOKEN, vocab) for _ in range(length)] for length in (16, 27, 40)]
    prompts = []
    for _ in range(count):
        stem = rng.choice(stems)
        keep = len(stem) if rng.random() < 0.6 else rng.randrange(1, len(stem))
        tail = [rng.randrange(FIRST_TOKEN, vocab) for _ in range(rng.randrange(1, 20))]
        prompts.append(tuple(stem[:keep] + tail))
    return prompts


def sampling_templates(rng: random.Random, vocab: int) -> list[tuple[str, dict, bool]]:
    """(feature, SamplingParams kwargs, compared) covering every sampling feature."""
    seed = rng.randrange(10 ** 6)
    token = lambda: rng.randrange(FIRST_TOKEN, vocab)  # noqa: E731
    return [
        ("greedy", dict(temperature=0.0), True),
        ("logprobs", dict(temperature=0.0, logprobs=rng.choice([0, 3])), True),
        ("prompt-logprobs", dict(temperature=0.0, prompt_logprobs=rng.choice([0, 2]), logprobs=1), True),
        ("top-k", dict(temperature=0.9, seed=seed, top_k=rng.choice([5, 40])), True),
        ("top-p-min-p", dict(temperature=1.1, seed=seed, top_p=0.8, min_p=0.05), True),
        ("penalties", dict(temperature=0.7, seed=seed, presence_penalty=0.8, frequency_penalty=0.4,
                           repetition_penalty=1.3), True),
        ("greedy-penalties", dict(temperature=0.0, repetition_penalty=1.5, frequency_penalty=1.0), True),
        ("logit-bias", dict(temperature=0.0, logit_bias={token(): 6.0, token(): 4.0, token(): -100.0}), True),
        ("n", dict(temperature=1.0, seed=seed, n=rng.choice([2, 3]), logprobs=1), True),
        ("best-of", dict(temperature=1.0, seed=seed, n=rng.choice([1, 2]), best_of=3), True),
        ("unseeded", dict(temperature=1.0, top_k=50), False),
    ]


def base_specs(rng: random.Random, vocab: int) -> list[Spec]:
    """NUM_BASE_SPECS specs, the sampling features taken in turn, random lengths."""
    specs = []
    for i, prompt in enumerate(make_prompts(rng, vocab, NUM_BASE_SPECS)):
        templates = sampling_templates(rng, vocab)
        feature, params, compared = templates[i % len(templates)]
        params = dict(params, max_tokens=rng.randint(1, 24), ignore_eos=rng.random() < 0.5)
        if rng.random() < 0.2:
            params["min_tokens"] = rng.randint(0, params["max_tokens"])
        specs.append(Spec.of(feature, prompt, params, compared))
    return specs


DERIVED_FEATURES = ("stop-string", "stop-token", "min-tokens")


def derived_specs(rng: random.Random, references: dict) -> list[Spec]:
    """Specs whose stop string or stop token id comes from a solo output (greedy or seeded), so that it hits."""
    derived = []
    for spec, result in references.items():
        sample = result.samples[0]
        if not spec.compared or spec.ranked or len(sample.tokens) < 4 or len(sample.text.strip()) < 4:
            continue
        feature = DERIVED_FEATURES[len(derived) % len(DERIVED_FEATURES)]
        if feature == "stop-string":
            start = rng.randrange(1, len(sample.text) - 2)
            stop = sample.text[start:start + rng.randint(1, 3)]
            if not stop.strip():
                continue
            derived.append(spec.derive(feature, stop=[stop, "never in any output"],
                                       include_stop_str_in_output=rng.random() < 0.5))
        elif feature == "stop-token":
            derived.append(spec.derive(feature, stop_token_ids=[sample.tokens[rng.randrange(1, len(sample.tokens))],
                                                                7]))
        else:  # the first token may not stop the request before min_tokens
            derived.append(spec.derive(feature, stop_token_ids=[sample.tokens[0]],
                                       min_tokens=min(2, spec.kwargs["max_tokens"])))
    return derived


# ------------------------------------------------------------------------------------------------ running
def run_alone(engine: LLMEngine, spec: Spec) -> Result:
    """The spec as the only request of the idle engine."""
    assert not engine.has_unfinished_requests()
    result = Result()
    engine.add_request("solo", {"prompt_token_ids": list(spec.prompt)}, spec.sampling_params(), output_kind="final")
    while engine.has_unfinished_requests():
        for output in engine.step():
            result.absorb(output, "final")
    assert result.finished
    return result


def check_after_step(engine: LLMEngine) -> None:
    """The pool's invariants, block tables held exactly by the running requests and covering their computed
    tokens, and cached blocks holding the tokens their hash says."""
    kv = engine.scheduler.kv_cache
    tables = kv.block_tables()
    check_pool_invariants(kv.pool, tables)
    holders = {rid for rid, table in tables.items() if table}
    running = {r.request_id: r for r in engine.scheduler.running}
    assert holders == set(running), f"block tables of {sorted(holders)} but running {sorted(running)}"
    for rid, request in running.items():
        table = tables[rid]
        assert len(table) == kv.blocks_needed(request.num_computed_tokens), \
            f"{rid}: {len(table)} blocks for {request.num_computed_tokens} computed tokens"
        check_cached_blocks(rid, table, request.all_token_ids)


def check_cached_blocks(rid: str, table, tokens: list[int]) -> None:
    """A block carrying a hash holds, at its place in the request, exactly the tokens that hash chains."""
    parent = None
    for index, block in enumerate(table):
        if index * BLOCK_SIZE + BLOCK_SIZE > len(tokens):
            assert block.block_hash is None, f"{rid}: block {block.block_id} is cached but not full of known tokens"
            return
        parent = hash_block(parent, tokens[index * BLOCK_SIZE:(index + 1) * BLOCK_SIZE])
        assert block.block_hash in (None, parent), f"{rid}: block {block.block_id} is cached with other tokens"


@dataclasses.dataclass
class Live:
    """A request of the fuzz: its spec, its output kind, what it reported, whether it was preempted."""

    spec: Spec
    kind: str
    result: Result = dataclasses.field(default_factory=Result)
    preempted: bool = False


@dataclasses.dataclass
class Fuzz:
    """The random workload: requests in flight, those that ended, and what was seen along the way."""

    engine: LLMEngine
    specs: list
    rng: random.Random
    live: dict = dataclasses.field(default_factory=dict)  # request id -> Live
    done: list = dataclasses.field(default_factory=list)  # (Live, aborted)
    ended_ids: list = dataclasses.field(default_factory=list)
    preempted: set = dataclasses.field(default_factory=set)
    steps: int = 0
    drains: int = 0
    next_id: int = 0

    def arrive(self) -> None:
        spec = self.rng.choice(self.specs)
        if self.ended_ids and self.rng.random() < REUSE_ID_P:
            request_id = self.ended_ids.pop(self.rng.randrange(len(self.ended_ids)))
        else:
            request_id, self.next_id = f"r{self.next_id}", self.next_id + 1
        kind = self.rng.choice(["cumulative", "delta", "final"])
        self.engine.add_request(request_id, {"prompt_token_ids": list(spec.prompt)}, spec.sampling_params(),
                                output_kind=kind)
        self.live[request_id] = Live(spec, kind)

    def abort(self) -> None:
        request_id = self.rng.choice(sorted(self.live))
        self.engine.abort_request(request_id)
        self.end(request_id, aborted=True)

    def end(self, request_id: str, aborted: bool) -> None:
        self.done.append((self.live.pop(request_id), aborted))
        self.ended_ids.append(request_id)

    def step(self) -> None:
        for output in self.engine.step():
            live = self.live[output.request_id]
            live.result.absorb(output, live.kind)
            if output.finished:
                self.end(output.request_id, aborted=False)
        self.steps += 1
        for request in self.engine.scheduler.requests.values():
            if request.num_preemptions:
                parent_id = request.request_id.split("_", 1)[-1]  # n > 1 children are "{i}_{parent id}"
                if parent_id in self.live:
                    self.live[parent_id].preempted = True
                    self.preempted.add(parent_id)
        check_after_step(self.engine)

    def run(self, num_steps: int) -> None:
        """Random arrivals and aborts around the steps; every DRAIN_EVERY steps, and at the end, let every
        request finish and check that all blocks are free."""
        next_drain = DRAIN_EVERY
        while self.steps < num_steps:
            if self.steps >= next_drain:
                self.drain()
                next_drain += DRAIN_EVERY
            if len(self.live) < MAX_LIVE and self.rng.random() < ARRIVAL_P:
                for _ in range(self.rng.choice([1, 1, 2, 3])):
                    self.arrive()
            if self.live and self.rng.random() < ABORT_P:
                self.abort()
            if self.engine.has_unfinished_requests():
                self.step()
        self.drain()

    def drain(self) -> None:
        while self.engine.has_unfinished_requests():
            self.step()
        assert not self.live, f"requests that never finished: {sorted(self.live)}"
        assert_all_blocks_free(self.engine)
        self.drains += 1


def assert_all_blocks_free(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] == NUM_BLOCKS - 1, stats
    assert not any(engine.scheduler.kv_cache.block_tables().values())
    assert engine.get_num_unfinished_requests() == 0 and not engine.has_unfinished_requests()


# ------------------------------------------------------------------------------------------------ comparing
def assert_same(got: Result, want: Result) -> None:
    """Tokens, text and stop reasons exactly; logprob values within LOGPROB_TOLERANCE."""
    assert sorted(got.samples) == sorted(want.samples), f"samples {sorted(got.samples)}, solo {sorted(want.samples)}"
    for index, sample in want.samples.items():
        mine = got.samples[index]
        assert (mine.tokens, mine.text, mine.finish_reason, mine.stop_reason) == \
            (sample.tokens, sample.text, sample.finish_reason, sample.stop_reason), \
            f"sample {index}: {mine.tokens} {mine.finish_reason}/{mine.stop_reason!r}, solo {sample.tokens} " \
            f"{sample.finish_reason}/{sample.stop_reason!r}"
        assert_same_logprobs(mine.logprobs, sample.logprobs, f"sample {index} logprobs")
        if sample.cumulative_logprob is not None:
            assert mine.cumulative_logprob == pytest.approx(sample.cumulative_logprob, abs=1e-3), \
                f"sample {index}: cumulative logprob {mine.cumulative_logprob}, solo {sample.cumulative_logprob}"
    assert (got.prompt_logprobs is None) == (want.prompt_logprobs is None), "prompt_logprobs present in one only"
    assert_same_logprobs(got.prompt_logprobs or [], want.prompt_logprobs or [], "prompt_logprobs")


def assert_same_logprobs(got: list, want: list, what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} entries, solo {len(want)}"
    for position, (mine, theirs) in enumerate(zip(got, want)):
        assert (mine is None) == (theirs is None), f"{what}[{position}]: {mine}, solo {theirs}"
        if theirs is not None:
            assert set(mine) == set(theirs), f"{what}[{position}]: tokens {set(mine)}, solo {set(theirs)}"
            for token, logprob in theirs.items():
                assert mine[token].logprob == pytest.approx(logprob.logprob, abs=LOGPROB_TOLERANCE), \
                    f"{what}[{position}][{token}]: {mine[token].logprob}, solo {logprob.logprob}"


def assert_prefix(got: Result, want: Result) -> None:
    """An aborted request's tokens so far are the start of its solo run's."""
    for index, sample in got.samples.items():
        reference = want.samples[index].tokens
        assert sample.tokens == reference[:len(sample.tokens)], \
            f"sample {index} aborted at {sample.tokens}, solo {reference}"


def within_limits(spec: Spec, got: Result) -> bool:
    """An unseeded request's output: n samples of 1 .. max_tokens tokens, each finished."""
    params = spec.kwargs
    return sorted(got.samples) == list(range(params.get("n", 1))) and all(
        1 <= len(s.tokens) <= params["max_tokens"] and s.finish_reason in ("stop", "length")
        for s in got.samples.values())


# ------------------------------------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def engine(tiny_model_with_tokenizer):
    return LLMEngine(EngineArgs(model=str(tiny_model_with_tokenizer), **ENGINE))


@pytest.mark.slow
def test_random_workload_keeps_the_pool_consistent_and_outputs_equal_solo_runs(engine, capsys):
    rng = random.Random(SEED)
    vocab = engine.model_config.vocab_size
    started = time.monotonic()
    references = {spec: run_alone(engine, spec) for spec in base_specs(rng, vocab)}
    references |= {spec: run_alone(engine, spec) for spec in derived_specs(rng, references)}
    assert_all_blocks_free(engine)
    solo_s = time.monotonic() - started

    fuzz = Fuzz(engine, list(references), rng)
    hits_before = engine.stats()["prefix_cache_hits"]
    started = time.monotonic()
    fuzz.run(STEPS)
    fuzz_s = time.monotonic() - started
    with capsys.disabled():
        print(f"\nengine fuzz: {len(references)} specs run alone in {solo_s:.0f}s; {fuzz.steps} steps in "
              f"{fuzz_s:.0f}s ({fuzz.steps / fuzz_s:.0f} steps/s): {len(fuzz.done)} requests "
              f"({sum(aborted for _, aborted in fuzz.done)} aborted, {len(fuzz.preempted)} preempted), "
              f"{fuzz.drains} drains, {engine.stats()['prefix_cache_hits'] - hits_before} prefix-cache block hits")

    mismatches = [f"{live.spec.feature} ({live.kind} output{', preempted' if live.preempted else ''}"
                  f"{', aborted' if aborted else ''}): {str(problem).splitlines()[0][:200]}"
                  for live, aborted in fuzz.done if (problem := mismatch(live, aborted, references)) is not None]
    by_kind = collections.Counter(m.split(": ", 2)[1].split("[")[0] for m in mismatches)
    assert not mismatches, f"{len(mismatches)} of {len(fuzz.done)} requests differ from their solo run " \
        f"({dict(by_kind)}):\n" + "\n".join(mismatches[:12])
    finished = [live for live, aborted in fuzz.done if not aborted]
    stops = [sample.stop_reason for live in finished for sample in live.result.samples.values()]
    assert any(aborted for _, aborted in fuzz.done) and fuzz.preempted, "no abort or no preemption happened"
    assert engine.stats()["prefix_cache_hits"] > hits_before and fuzz.drains >= 1
    assert any(isinstance(s, str) for s in stops) and any(isinstance(s, int) for s in stops), "no stop hit"
    features = {template[0] for template in sampling_templates(random.Random(0), vocab)} | set(DERIVED_FEATURES)
    assert features <= {live.spec.feature for live in finished}, "a feature was never run to the end"


def mismatch(live: "Live", aborted: bool, references: dict) -> AssertionError | None:
    """How a request's output departs from what its solo run allows, or None."""
    try:
        if not live.spec.compared:
            assert aborted or within_limits(live.spec, live.result), live.result
        elif aborted:
            assert_prefix(live.result, references[live.spec])
        else:
            assert_same(live.result, references[live.spec])
    except AssertionError as e:
        return e
    return None


@pytest.mark.slow
def test_prompt_logprobs_are_whole_after_a_preemption_during_prefill(engine):
    """The fuzz's smallest reproduction of a lost-prompt-logprobs case: five long generations fill the pool, then a
    request asking for prompt logprobs arrives; it is the newest, so it is preempted while its prompt is being
    computed in chunks, and its prompt logprobs must still cover the whole prompt."""
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    busy = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    for i in range(5):
        engine.add_request(f"busy{i}", {"prompt_token_ids": [rng.randrange(FIRST_TOKEN, vocab) for _ in range(31)]},
                           busy)
    for _ in range(6):
        engine.step()
    spec = Spec.of("prompt-logprobs", [rng.randrange(FIRST_TOKEN, vocab) for _ in range(41)],
                   dict(temperature=0.0, max_tokens=4, prompt_logprobs=0))
    engine.add_request("late", {"prompt_token_ids": list(spec.prompt)}, spec.sampling_params(), output_kind="final")
    result, preemptions = Result(), 0
    while engine.has_unfinished_requests():
        late = engine.scheduler.requests.get("late")
        preemptions = max(preemptions, late.num_preemptions if late is not None else 0)
        for output in engine.step():
            if output.request_id == "late":
                result.absorb(output, "final")
    assert preemptions > 0, "the scenario was meant to preempt the late request"
    assert_same(result, run_alone(engine, spec))


# ------------------------------------------------------------------------------------------------ the checker
def corrupt_free_block_with_a_reference(pool: BlockPool, tables: dict) -> None:
    next(iter(pool._free.values())).ref_count = 1


def corrupt_lose_a_free_block(pool: BlockPool, tables: dict) -> None:
    pool._free.popitem()


def corrupt_extra_reference(pool: BlockPool, tables: dict) -> None:
    tables["a"][0].ref_count += 1


def corrupt_table_holds_a_free_block(pool: BlockPool, tables: dict) -> None:
    tables["b"] = [next(iter(pool._free.values()))]


def corrupt_table_holds_a_block_twice(pool: BlockPool, tables: dict) -> None:
    tables["a"].append(tables["a"][0])
    tables["a"][0].ref_count += 1


def corrupt_table_holds_the_null_block(pool: BlockPool, tables: dict) -> None:
    tables["a"].append(pool.blocks[0])


def corrupt_hash_without_map_entry(pool: BlockPool, tables: dict) -> None:
    tables["a"][1].block_hash = b"not in the map"


def corrupt_map_entry_of_another_block(pool: BlockPool, tables: dict) -> None:
    pool._cached[b"h0"] = tables["a"][1]


@pytest.mark.parametrize("corrupt", [corrupt_free_block_with_a_reference, corrupt_lose_a_free_block,
                                     corrupt_extra_reference, corrupt_table_holds_a_free_block,
                                     corrupt_table_holds_a_block_twice, corrupt_table_holds_the_null_block,
                                     corrupt_hash_without_map_entry, corrupt_map_entry_of_another_block],
                         ids=lambda f: f.__name__.removeprefix("corrupt_"))
def test_check_invariants_catches_each_kind_of_corruption(corrupt):
    pool = BlockPool(8)
    tables = {"a": pool.allocate(3)}
    pool.register(tables["a"][0], b"h0")
    pool.free(pool.allocate(2))  # two blocks back in the free queue
    check_pool_invariants(pool, tables)  # consistent so far
    corrupt(pool, tables)
    with pytest.raises(AssertionError):
        check_pool_invariants(pool, tables)
