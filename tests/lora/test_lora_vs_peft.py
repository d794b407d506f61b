"""Each adapter's logits equal the Hugging Face model with that PEFT adapter merged into its weights (f32, 1e-4),
with base-model and adapter rows mixed in one step; greedy tokens through the engine equal the merged model's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm import LLM, LoRARequest, SamplingParams, load_model
from jaxllm.lora import device_slots
from jaxllm.lora.peft import load_peft_adapter
from jaxllm.model import SequenceChunk, build_step_batch, forward, init_kv_cache, lora_weight
from tests.lora.adapters import hf_greedy, hf_logits

F32_TOL = 1e-4
MAX_RANK = 8
BLOCK = 4

# (variant, adapter options): GQA with Llama 3 rope, q/k/v biases, tied embeddings with one KV head, rsLoRA,
# a subset of modules, and rank below the slots' rank
CASES = [
    ("llama3", dict(rank=8, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj"))),
    ("qwen2", dict(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))),
    ("smollm2", dict(rank=6, alpha=4.0, use_rslora=True, target_modules=("k_proj", "o_proj", "up_proj"))),
    # new families: Qwen3 (q/k norms), Gemma 2 (soft-caps, window, sandwich norms), Phi-3's fused module names
    ("qwen3", dict(rank=8, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"))),
    ("gemma2", dict(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "up_proj", "down_proj"))),
    ("phi3", dict(rank=8, target_modules=("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))),
]


@pytest.mark.slow
@pytest.mark.parametrize("arch,options", CASES, ids=[c[0] for c in CASES])
def test_logits_equal_the_merged_peft_model(arch, options, tiny_model_dir, peft_adapter):
    directory, hf_model = tiny_model_dir(arch)
    adapter_dir, merged = peft_adapter(arch, "a", **options)
    other_targets = ("qkv_proj", "gate_up_proj") if arch == "phi3" else ("q_proj", "gate_proj")
    other_dir, other_merged = peft_adapter(arch, "b", rank=2, target_modules=other_targets)
    loaded = load_model(directory)
    config = loaded.config
    slots = device_slots.init_slots(config, 3, MAX_RANK, jnp.float32)
    write = device_slots.slot_writer(None, config.num_layers)
    slots = write(slots, np.int32(3), load_peft_adapter(str(adapter_dir), config, MAX_RANK, np.float32))
    slots = write(slots, np.int32(1), load_peft_adapter(str(other_dir), config, MAX_RANK, np.float32))

    tokens = np.random.RandomState(0).randint(0, config.vocab_size, 13)
    chunks = [SequenceChunk(tokens, 0, [1 + 4 * i, 2 + 4 * i, 3 + 4 * i, 4 + 4 * i], "all") for i in range(3)]
    batch = build_step_batch(chunks, BLOCK, num_tokens=48)
    slot_per_token = np.zeros(48, np.int32)
    slot_per_token[13:26], slot_per_token[26:39] = 3, 1  # rows: base model, adapter a (slot 3), adapter b (slot 1)
    batch = batch.replace(lora_slots=slot_per_token)

    def run(params, slots, kv, batch):
        params = lora_weight.attach(params, slots, batch.lora_slots)
        return forward(params, kv, batch, config=config)[0]

    logits = np.asarray(jax.jit(run)(loaded.params, slots, init_kv_cache(config, 16, BLOCK), batch))
    expected = [hf_logits(m, tokens) for m in (hf_model, merged, other_merged)]
    assert np.abs(expected[1] - expected[0]).max() > 0.5  # the adapter matters
    for row, want in enumerate(expected):
        np.testing.assert_allclose(logits[13 * row:13 * (row + 1)], want, atol=F32_TOL, rtol=0)


@pytest.mark.slow
def test_greedy_tokens_equal_the_merged_model_over_32_steps(tiny_model_dir, peft_adapter):
    directory, hf_model = tiny_model_dir("llama3")
    adapters = {name: peft_adapter("llama3", name, rank=rank) for name, rank in (("x", 8), ("y", 4))}
    llm = LLM(str(directory), enable_lora=True, max_loras=2, max_lora_rank=MAX_RANK, skip_tokenizer=True,
              max_model_len=64, max_num_seqs=4)
    prompts = [[5, 17, 99, 3, 42, 8], [200, 1, 2, 3]]
    requests = [LoRARequest(name, i + 1, str(path)) for i, (name, (path, _)) in enumerate(adapters.items())]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    got = llm.generate([{"prompt_token_ids": p} for p in prompts * 3], params, use_tqdm=False,
                       lora_request=[requests[0], requests[0], requests[1], requests[1], None, None])
    models = [adapters["x"][1]] * 2 + [adapters["y"][1]] * 2 + [hf_model] * 2
    for output, prompt, model in zip(got, prompts * 3, models):
        assert output.outputs[0].token_ids == hf_greedy(model, prompt, 32)
