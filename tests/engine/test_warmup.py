"""After warm-up no workload compiles anything: a randomized workload using every sampling feature (structured
outputs included), prompts of every length up to max_model_len, chunked prefill, prefix-cache hits, preemption,
n > 1 and aborts builds zero XLA programs (counted through jax.monitoring). The Pallas path compiles per (T, decode-only) only."""

from __future__ import annotations

import numpy as np
import pytest

from jaxllm.compile_counter import CompileCounter
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.sampling_params import SamplingParams
from jaxllm.structured_outputs import StructuredOutputsParams

MAX_MODEL_LEN = 96


def _random_params(rng: np.random.RandomState) -> SamplingParams:
    kind = rng.randint(9)
    common = dict(max_tokens=int(rng.randint(1, 24)), seed=int(rng.randint(100)) if rng.rand() < 0.5 else None)
    if kind == 0:
        return SamplingParams(temperature=0.0, max_tokens=common["max_tokens"], ignore_eos=bool(rng.rand() < 0.5))
    if kind == 1:
        return SamplingParams(temperature=0.8, top_p=0.9, top_k=int(rng.randint(0, 50)), min_p=0.05, **common)
    if kind == 2:
        return SamplingParams(n=int(rng.randint(2, 4)), temperature=1.0, logprobs=int(rng.randint(0, 21)), **common)
    if kind == 3:
        return SamplingParams(temperature=0.7, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=-0.5,
                              **common)
    if kind == 4:
        return SamplingParams(temperature=0.0, prompt_logprobs=int(rng.randint(0, 6)), logprobs=3,
                              max_tokens=common["max_tokens"])
    if kind == 5:
        return SamplingParams(temperature=1.2, logit_bias={13: 4.0, 200: -100.0}, min_tokens=2,
                              stop_token_ids=[30, 31], **{**common, "max_tokens": common["max_tokens"] + 2})
    if kind == 6:
        return SamplingParams(temperature=0.9, stop=["e", " the"], include_stop_str_in_output=bool(rng.rand() < .5),
                              **common)
    if kind == 7:
        return SamplingParams(temperature=0.0, max_tokens=MAX_MODEL_LEN, ignore_eos=True)  # to the context limit
    constraint = [StructuredOutputsParams(choice=["yes", "no"]), StructuredOutputsParams(regex="[a-z]{2,9}"),
                  StructuredOutputsParams(json={"enum": [1, 2]})][rng.randint(3)]  # structured outputs
    return SamplingParams(temperature=float(rng.choice([0.0, 0.8])), structured_outputs=constraint, **common)


def _random_prompt(rng: np.random.RandomState, shared: list[int]) -> list[int] | str:
    if rng.rand() < 0.2:
        return "Once upon a time there was" + " a story" * int(rng.randint(0, 8))
    length = int(rng.randint(1, MAX_MODEL_LEN))
    tokens = rng.randint(3, 49152, size=length).tolist()
    return shared[:length // 2] + tokens[length // 2:] if rng.rand() < 0.5 else tokens  # prefix-cache hits


@pytest.mark.slow
@pytest.mark.parametrize("async_scheduling,dtype", [(True, "float32"), (False, "float32"), (True, "bfloat16")],
                         ids=["async", "sync", "async-bfloat16"])  # bfloat16: the CPU kernels of that dtype
def test_randomized_workload_after_warmup_compiles_nothing(tiny_model_with_tokenizer, async_scheduling, dtype):
    engine = LLMEngine(EngineArgs(model=str(tiny_model_with_tokenizer), max_model_len=MAX_MODEL_LEN, block_size=8,
                                  max_num_seqs=4, max_num_batched_tokens=32, num_gpu_blocks=32, warmup=True,
                                  async_scheduling=async_scheduling, dtype=dtype))
    assert set(engine.runner.programs.compiled) == set(engine.runner.buckets.all_programs())
    rng = np.random.RandomState(int(async_scheduling))
    shared = rng.randint(3, 49152, size=MAX_MODEL_LEN).tolist()
    preempted, aborted, finished = [], 0, 0
    original = engine.scheduler._preempt
    engine.scheduler._preempt = lambda victim, chunks: (preempted.append(victim), original(victim, chunks))
    with CompileCounter() as compiles:
        for i in range(60):
            prompt = _random_prompt(rng, shared)
            params = _random_params(rng)
            length = len(prompt) if isinstance(prompt, list) else 30
            if params.max_tokens + length > MAX_MODEL_LEN:
                params.max_tokens = max(1, MAX_MODEL_LEN - length - 1)
                params.min_tokens = min(params.min_tokens, params.max_tokens)
            engine.add_request(str(i), prompt, params)
            for _ in range(int(rng.randint(0, 4))):
                finished += sum(o.finished for o in engine.step())
            if rng.rand() < 0.1 and engine.get_num_unfinished_requests():
                engine.abort_request(rng.choice(list(engine.processor.parents)))
                aborted += 1
        while engine.has_unfinished_requests():
            finished += sum(o.finished for o in engine.step())
    assert compiles.count == 0, compiles.events
    assert preempted and aborted and finished > 40
    assert engine.stats()["prefix_cache_hits"] > 0


@pytest.mark.slow
def test_pallas_path_compiles_per_token_bucket_and_decode_flag_only(tiny_model_dir):
    """Interpret mode on CPU: contexts and query lengths of every size meet only the (T, decode-only) programs."""
    engine = LLMEngine(EngineArgs(model=str(tiny_model_dir("llama3")[0]), skip_tokenizer=True, attention="pallas",
                                  max_model_len=64, block_size=16, max_num_seqs=4, max_num_batched_tokens=16))
    rng = np.random.RandomState(0)

    def run_workload():
        for i in range(10):
            engine.add_request(str(rng.rand()), rng.randint(3, 256, size=int(rng.randint(1, 40))).tolist(),
                               SamplingParams(temperature=0.0, max_tokens=int(rng.randint(1, 20)), ignore_eos=True,
                                              detokenize=False))
        while engine.has_unfinished_requests():
            engine.step()

    run_workload()
    runner = engine.runner
    forward = {(k.size, k.decode_only) for k in runner.programs.compiled if k.kind == "forward"}
    assert forward <= {(1, True), (2, True), (4, True), (2, False), (4, False), (8, False), (16, False)}
    assert any(decode_only for _, decode_only in forward) and any(not decode_only for _, decode_only in forward)
    built = len(runner.programs.compiled)
    with CompileCounter() as compiles:
        run_workload()  # other prompt lengths, contexts and mixes: only keys not met before may compile
    assert compiles.count == len(runner.programs.compiled) - built
