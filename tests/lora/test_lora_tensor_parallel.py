"""LoRA under tensor parallelism (on the test process's fake CPU devices, tests/conftest.py): B split with the
column-parallel base rows (q|k|v, gate|up, laid out shard-major like them), A with the row-parallel base columns
(o, down); the engine at N = 2 and 4 gives the unsharded engine's greedy tokens, on a mix of the base model and
several adapters swapping through two slots."""

from __future__ import annotations

import pytest

from jaxllm import LLM, LoRARequest, SamplingParams


def generate(model: str, adapters: list[str], tp_size: int | None) -> list[list[int]]:
    llm = LLM(model, tensor_parallel_size=tp_size, enable_lora=True, max_loras=2, max_lora_rank=8,
              skip_tokenizer=True, max_model_len=64, max_num_seqs=4, max_num_batched_tokens=32)
    loras = [None] + [LoRARequest(f"a{i}", i + 1, path) for i, path in enumerate(adapters)]
    prompts = [{"prompt_token_ids": [3 + i, 40 + 7 * i, 11, 200 - i] * (1 + i % 3)} for i in range(2 * len(loras))]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
    outputs = llm.generate(prompts, params, use_tqdm=False,
                           lora_request=[loras[i % len(loras)] for i in range(len(prompts))])
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.slow
def test_sharded_lora_engine_gives_the_unsharded_tokens(tiny_model_dir, peft_adapter):
    directory, _ = tiny_model_dir("llama3")  # KV heads 2: split at N = 2, replicated at N = 4
    adapters = [str(peft_adapter("llama3", f"tp{i}", rank=rank)[0]) for i, rank in enumerate((8, 4, 2))]
    want = generate(str(directory), adapters, None)
    report = {}
    for n in (2, 4):
        got = generate(str(directory), adapters, n)
        report[f"tp{n}"] = {"equal": got == want, "tokens": got}
    assert set(report) == {"tp2", "tp4"}
    assert all(row["equal"] for row in report.values()), report


def test_slot_shardings_follow_the_base_weights():
    from jaxllm.lora.device_slots import slot_shardings
    from jaxllm.model.tensor_parallel import make_mesh

    per_layer = slot_shardings(make_mesh(1), num_layers=3)
    assert len(per_layer) == 3
    specs = {field: (tuple(a.spec), tuple(b.spec)) for field, (a, b) in per_layer[2].items()}
    assert specs["w_qkv"] == ((None, None, None), (None, "tp", None))  # b over q|k|v rows
    assert specs["w_gate_up"] == ((None, None, None), (None, "tp", None))
    assert specs["wo"] == ((None, None, "tp"), (None, None, None))  # a over o's input columns
    assert specs["w_down"] == ((None, None, "tp"), (None, None, None))
