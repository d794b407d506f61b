"""The engine with tensor_parallel_size N (on the test process's fake CPU devices, tests/conftest.py) gives the
unsharded engine's greedy tokens, through chunked prefill, prefix-cache hits and preemption; the default model at
N = 3 too, and N = 2 is refused for it (9 query heads). An AWQ int4 model (packed weights split with their groups) at
N = 2 and 4 equals N = 1; a size that would split a quantization group is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.sampling_params import SamplingParams

TINY = dict(skip_tokenizer=True, max_model_len=128, block_size=4, max_num_seqs=2, max_num_batched_tokens=8,
            num_gpu_blocks=20)  # few programs to compile; two long sequences do not fit the pool together
SHARED = list(range(100, 120))  # a prefix several prompts share (prefix-cache hits)


def workload() -> list[list[int]]:
    return [SHARED + list(range(5 + i, 10 + 3 * i)) if i % 2 else list(range(5 + i, 30 + 2 * i)) for i in range(6)]


def run(model: str | None, tp_size: int | None, engine_args: dict, prompts: list[list[int]], max_tokens: int):
    engine = LLMEngine(EngineArgs(model=model, tensor_parallel_size=tp_size, **engine_args))
    preempted = []
    original = engine.scheduler._preempt
    engine.scheduler._preempt = lambda victim, chunks: (preempted.append(victim), original(victim, chunks))
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                                          detokenize=False))
    tokens = {}
    while engine.has_unfinished_requests():
        tokens.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    return tokens, len(preempted), engine.stats()["prefix_cache_hits"]


def compare(name: str, model: str | None, sizes, engine_args: dict, prompts, max_tokens: int) -> dict:
    """{"NAME/tpN": {"equal": the unsharded engine's tokens, "preempted": preemptions, "prefix_hits": int}} of the
    engine at each size in `sizes`, against the unsharded engine."""
    want, _, _ = run(model, None, engine_args, prompts, max_tokens)
    results = {}
    for n in sizes:
        got, preempted, hits = run(model, n, engine_args, prompts, max_tokens)
        results[f"{name}/tp{n}"] = {"equal": got == want, "preempted": preempted, "prefix_hits": hits}
    return results


def refused(model: str | None, tp_size: int, engine_args: dict) -> str:
    try:
        LLMEngine(EngineArgs(model=model, tensor_parallel_size=tp_size, **engine_args))
    except ValueError as e:
        return str(e)
    return "accepted"


# variant -> the sizes it runs at, every architecture: Llama 3 KV heads 2 split (N = 2) and replicated (N = 4);
# Llama 2 MHA split to one KV head per device; Mistral's one KV head replicated; q/k/v bias with tied embeddings
# (Qwen2). (Every KV-head ratio at N = 1, 2, 4, 8 is covered at the model
# level, tests/model/test_tensor_parallel.py.)
VARIANTS = {"llama3": (2, 4), "llama2": (4,), "mistral": (4,), "qwen2": (2,)}


AWQ_SIZES = (2, 4)  # group size 16: o_proj's 64 input rows are 4 groups, one per device at N = 4


@pytest.fixture(scope="module")
def report(tiny_model_dir, awq_model_dir) -> dict:
    """compare's rows of every run, plus {"refused": {"NAME/tpN": the ValueError's message}}."""
    results = {"refused": {}}
    for variant, sizes in VARIANTS.items():
        model = str(tiny_model_dir(variant)[0])
        results.update(compare(Path(model).name, model, sizes, TINY, workload(), max_tokens=32))
    awq = awq_model_dir("llama3")
    results.update(compare(awq.name, str(awq), AWQ_SIZES, TINY, workload(), max_tokens=32))
    default = dict(max_model_len=256, max_num_seqs=2, max_num_batched_tokens=64)
    results.update(compare("default", None, [3], default, [[504, 3575, 282, 4649, 314], list(range(900, 960))],
                           max_tokens=8))
    results["refused"]["default/tp2"] = refused(None, 2, default)
    straddled = awq_model_dir("llama3", group_size=32)  # o_proj's 2 groups of 32 over 4 devices
    results["refused"][f"{straddled.name}/tp4"] = refused(str(straddled), 4, TINY)
    return results


@pytest.mark.slow
def test_sharded_engine_gives_the_unsharded_tokens(report, tiny_model_dir, awq_model_dir):
    runs = {name: row for name, row in report.items() if name != "refused"}
    expected = {f"{Path(tiny_model_dir(v)[0]).name}/tp{n}" for v, sizes in VARIANTS.items() for n in sizes}
    expected |= {f"{awq_model_dir('llama3').name}/tp{n}" for n in AWQ_SIZES}
    assert set(runs) == expected | {"default/tp3"}
    assert all(row["equal"] for row in runs.values()), runs
    tiny = [row for name, row in runs.items() if not name.startswith("default")]
    assert all(row["preempted"] > 0 and row["prefix_hits"] > 0 for row in tiny), tiny  # the workload did both


@pytest.mark.slow
def test_a_size_that_cannot_split_the_default_model_is_refused(report):
    assert report["refused"]["default/tp2"] == (
        "tensor_parallel_size 2 does not split this model's 9 query heads, 3 KV heads and MLP width 1536 evenly; "
        "valid sizes: 1, 3")


@pytest.mark.slow
def test_a_size_that_would_split_a_quantization_group_is_refused(report, awq_model_dir):
    name = awq_model_dir("llama3", group_size=32).name
    assert report["refused"][f"{name}/tp4"] == (
        "tensor_parallel_size 4 cannot split .layers[0].wo.zeros (2, 64): an axis of 2 does not divide into 4 "
        "equal parts (a packed int4 weight's groups of rows must not straddle two devices: choose another size, "
        "or quantize with a smaller group size)")


def test_tensor_parallel_size_is_an_engine_argument_and_a_flag():
    from jaxllm.entrypoints.cli import build_parser

    assert EngineArgs().tensor_parallel_size is None
    for command in (["serve"], ["generate", "hi"]):
        assert build_parser().parse_args([*command, "--tensor-parallel-size", "2"]).tensor_parallel_size == 2
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1, got 0"):
        EngineArgs(tensor_parallel_size=0)
