"""Multi-LoRA through the engine: mixed batches equal solo runs, more adapters than slots swap through them,
prefix-cache hits never cross adapters, and the compiled programs do not depend on which adapters are mixed."""

from __future__ import annotations

import numpy as np
import pytest

from jaxllm import LLM, LoRARequest, SamplingParams
from jaxllm.compile_counter import CompileCounter
from tests.lora.adapters import hf_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 17, 99, 3, 42, 8, 7], [200, 1, 2, 3], [9] * 11, [31, 41, 59, 26, 53]]


def engine(directory, **options) -> LLM:
    settings = dict(enable_lora=True, max_loras=4, max_lora_rank=8, skip_tokenizer=True, max_model_len=96,
                    max_num_seqs=8, max_num_batched_tokens=64)
    return LLM(str(directory), **{**settings, **options})


def run(llm: LLM, prompts, loras, params=GREEDY) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, lora_request=loras)
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def adapters(peft_adapter):
    """Three adapters of ranks 8, 4 and 2 on the tiny llama3 model: [(LoRARequest, merged torch model)]."""
    made = []
    for i, (name, rank, targets) in enumerate((("r8", 8, None), ("r4", 4, ("q_proj", "v_proj", "down_proj")),
                                               ("r2", 2, ("gate_proj", "up_proj", "o_proj")))):
        options = {"rank": rank} if targets is None else {"rank": rank, "target_modules": targets}
        path, merged = peft_adapter("llama3", name, **options)
        made.append((LoRARequest(name, i + 1, str(path)), merged))
    return made


@pytest.mark.slow
def test_a_mixed_batch_equals_each_run_alone(tiny_model_dir, adapters):
    directory, base = tiny_model_dir("llama3")
    llm = engine(directory)
    loras = [None] + [lora for lora, _ in adapters]  # base model, then three adapters of different ranks
    mixed = run(llm, PROMPTS, loras)
    for prompt, lora, tokens in zip(PROMPTS, loras, mixed):
        assert run(llm, [prompt], [lora]) == [tokens]
    models = [base] + [model for _, model in adapters]
    assert mixed == [hf_greedy(model, prompt, GREEDY.max_tokens) for prompt, model in zip(PROMPTS, models)]


@pytest.mark.slow
def test_more_adapters_than_slots_swap_and_equal_their_solo_runs(tiny_model_dir, peft_adapter):
    directory, _ = tiny_model_dir("llama3")
    made = [peft_adapter("llama3", f"swap{i}", rank=4) for i in range(8)]
    loras = [LoRARequest(f"swap{i}", 10 + i, str(path)) for i, (path, _) in enumerate(made)]
    llm = engine(directory, max_loras=2, max_cpu_loras=3)  # 8 adapters through 2 device slots, 3 kept on the host
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    got = run(llm, prompts, loras)
    expected = [hf_greedy(model, prompt, GREEDY.max_tokens) for prompt, (_, model) in zip(prompts, made)]
    assert got == expected
    assert len(llm.engine.lora.slots) == 2
    assert run(llm, prompts[:1], loras[:1]) == expected[:1]  # read again from its directory after host eviction


@pytest.mark.slow
def test_requests_wait_while_every_slot_is_busy(tiny_model_dir, adapters):
    """max_loras=1: two adapters never share a step; both requests finish with their own adapter's tokens."""
    directory, _ = tiny_model_dir("llama3")
    llm = engine(directory, max_loras=1)
    seen = []
    schedule = llm.engine.scheduler.schedule

    def recording_schedule():
        out = schedule()
        seen.append({r.lora_int_id for r in llm.engine.scheduler.scheduled_requests(out)} - {0})
        return out

    llm.engine.scheduler.schedule = recording_schedule
    loras = [adapters[0][0], adapters[1][0], None]
    got = run(llm, PROMPTS[:3], loras)
    assert all(len(ids) <= 1 for ids in seen) and {1, 2} <= set().union(*seen)
    assert got == [hf_greedy(model, p, GREEDY.max_tokens) for p, model in
                   zip(PROMPTS[:3], [adapters[0][1], adapters[1][1], tiny_model_dir("llama3")[1]])]


@pytest.mark.slow
def test_prefix_cache_hits_never_cross_adapters(tiny_model_dir, adapters):
    directory, _ = tiny_model_dir("llama3")
    llm = engine(directory)
    prompt = [int(t) for t in np.random.RandomState(3).randint(0, 256, 40)]  # two full 16-token blocks to cache
    pool = llm.engine.scheduler.kv_cache.pool

    def hits_of(lora) -> tuple[int, list[int]]:
        before = pool.prefix_cache_hits
        tokens = run(llm, [prompt], [lora])[0]
        return pool.prefix_cache_hits - before, tokens

    first_a = hits_of(adapters[0][0])
    assert hits_of(adapters[1][0])[0] == 0  # the same tokens under another adapter: no hit
    assert hits_of(None)[0] == 0  # nor the base model
    again_a = hits_of(adapters[0][0])
    assert again_a[0] == 2 and again_a[1] == first_a[1]  # the same adapter hits both blocks, same tokens


@pytest.mark.slow
def test_programs_do_not_depend_on_which_adapters_are_mixed(tiny_model_dir, adapters):
    directory, _ = tiny_model_dir("llama3")
    llm = engine(directory, warmup=True, max_loras=2)
    for lora, _ in adapters:  # known up front, as a server's --lora-modules are
        llm.engine.add_lora(lora)
    compiled = llm.engine.runner.num_compiled_programs
    rng = np.random.RandomState(0)
    with CompileCounter() as compiles:  # every XLA program built, the slot writes' and eager ops' included
        for round_ in range(3):  # random mixes of the base model and three adapters through two slots
            loras = [[None, *[a for a, _ in adapters]][i] for i in rng.randint(0, 4, size=5)]
            prompts = [[int(t) for t in rng.randint(0, 256, rng.randint(2, 30))] for _ in loras]
            run(llm, prompts, loras, SamplingParams(temperature=0.8, max_tokens=int(rng.randint(1, 9)),
                                                    seed=round_))
    assert compiles.events == [] and llm.engine.runner.num_compiled_programs == compiled


def test_lora_off_keeps_the_programs_of_an_engine_without_lora(tiny_model_dir):
    """enable_lora=False: the forward program has no LoRA inputs (the step batch carries no slot ids)."""
    directory, _ = tiny_model_dir("llama3")
    llm = engine(directory, enable_lora=False)
    assert llm.engine.runner.lora_slots is None and llm.engine.lora is None
    run(llm, PROMPTS[:1], None)
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        run(llm, PROMPTS[:1], LoRARequest("x", 1, str(directory)))


def test_generate_with_lora_runs_each_prompt_with_its_adapter(tiny_model_dir, adapters):
    llm = engine(tiny_model_dir("llama3")[0])
    loras = [None, adapters[0][0], adapters[1][0]]
    expected = run(llm, PROMPTS[:3], loras)
    outputs = llm.generate_with_lora([{"prompt": p, "lora": lora} for p, lora in zip(PROMPTS, loras)], GREEDY,
                                     use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert expected[1] != expected[0]  # the adapter changes the output: the test would see it dropped
    with pytest.raises(ValueError, match="prompt dict key 'lora' is not supported.*generate_with_lora"):
        llm.generate({"prompt_token_ids": PROMPTS[0], "lora": adapters[0][0]}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match=r"requests\[0\] key 'lora_request' is not supported"):
        llm.generate_with_lora([{"prompt": PROMPTS[0], "lora_request": None}], GREEDY, use_tqdm=False)


@pytest.mark.slow
def test_a_draft_model_proposes_without_adapters_and_keeps_each_adapters_outputs(tiny_model_dir, adapters):
    """The draft model (the base model itself here) proposes from the context alone, without the requests'
    adapters; the adapted target verifies, so every output stays what plain decoding with its adapter generates,
    and the adapters' requests reject some of the base model's proposals."""
    directory, _ = tiny_model_dir("llama3")
    loras = [None] + [lora for lora, _ in adapters]
    plain = run(engine(directory), PROMPTS, loras)
    speculating = engine(directory, speculative_config={"model": str(directory), "num_speculative_tokens": 3})
    assert run(speculating, PROMPTS, loras) == plain
    stats = speculating.engine.stats()
    assert stats["spec_decode_num_draft_tokens"] > stats["spec_decode_num_accepted_tokens"] > 0
    assert run(speculating, PROMPTS[:1], [None]) == plain[:1]  # the base request accepts its own model's proposals
