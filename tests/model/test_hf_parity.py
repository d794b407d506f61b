"""jaxllm logits == Hugging Face transformers logits on tiny random models of every supported variant.

Prefill over a shuffled block table, then ragged steps mixing prefill chunks and decodes through the paged cache,
each compared with the HF logits of the full sequence at the same positions (teacher forcing).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from jaxllm import load_model
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, select_kernels

F32_TOL = 1e-4  # max abs logit difference (logits have std ~0.8 on these models)
BF16_REL_TOL = 0.04  # bf16: max abs difference / max abs logit, vs HF running in bf16 (measured <= 0.016)
BLOCK_SIZE = 4
NUM_BLOCKS = 48


def hf_logits(model, token_ids, dtype=torch.float32) -> np.ndarray:
    """[len(token_ids), V] logits of the HF model over the whole sequence. The shared fixture model is not
    touched: a round trip through bfloat16 would round its weights for every later test."""
    if dtype != torch.float32:
        model = copy.deepcopy(model).to(dtype)
    with torch.no_grad():
        out = model(torch.tensor(np.asarray(token_ids)[None])).logits[0]
    return out.float().numpy()


def model_forward(config, attention: str = "auto"):
    """The jitted forward with the default kernels (on CPU the native attention kernel, windows and soft-cap
    included), or with the attention implementation named."""
    return jit_forward(config, select_kernels(attention=attention))


def shuffled_blocks(seed: int) -> list[int]:
    """All block ids except the null block 0, in a random order, so tables are non-contiguous."""
    return list(np.random.RandomState(seed).permutation(np.arange(1, NUM_BLOCKS)))


def test_prefill_matches_hf(variant, tiny_model_dir):
    directory, hf_model = tiny_model_dir(variant)
    loaded = load_model(directory)
    tokens = np.random.RandomState(1).randint(0, loaded.config.vocab_size, size=23)
    blocks = shuffled_blocks(2)[:6]
    batch = build_step_batch([SequenceChunk(tokens, 0, blocks, want_logits="all")], BLOCK_SIZE,
                             num_tokens=32, num_seqs=2, max_blocks=8)  # padded token, sequence and block slots
    kv = init_kv_cache(loaded.config, NUM_BLOCKS, BLOCK_SIZE)
    logits, _ = model_forward(loaded.config)(loaded.params, kv, batch)
    np.testing.assert_allclose(np.asarray(logits)[:len(tokens)], hf_logits(hf_model, tokens), atol=F32_TOL, rtol=0)


# Each step: {sequence: number of new tokens}. A: 11-token prompt in one go; B: 9-token prompt chunked 5 + 4;
# C arrives at step 2 with 7 tokens; then all decode one token per step.
SCHEDULE = [{"A": 11, "B": 5}, {"A": 1, "B": 4, "C": 7}, {"A": 1, "B": 1, "C": 1}, {"C": 1, "A": 1},
            {"A": 1, "B": 1, "C": 1}]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mixed_paged_steps_match_hf(variant, dtype, tiny_model_dir):
    directory, hf_model = tiny_model_dir(variant)
    loaded = load_model(directory, dtype=dtype)
    config = loaded.config
    rng = np.random.RandomState(3)
    total = {s: sum(step.get(s, 0) for step in SCHEDULE) for s in "ABC"}
    streams = {s: rng.randint(0, config.vocab_size, size=n) for s, n in total.items()}
    torch_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
    expected = {s: hf_logits(hf_model, streams[s], torch_dtype) for s in "ABC"}
    free = shuffled_blocks(4)
    tables = {s: [free.pop() for _ in range(-(-total[s] // BLOCK_SIZE))] for s in "ABC"}

    forward = model_forward(config)
    kv = init_kv_cache(config, NUM_BLOCKS, BLOCK_SIZE, dtype=loaded.params.embed.dtype)
    done = {s: 0 for s in "ABC"}
    for step in SCHEDULE:
        order = list(step)
        chunks = [SequenceChunk(streams[s][done[s]:done[s] + step[s]], done[s], tables[s]) for s in order]
        batch = build_step_batch(chunks, BLOCK_SIZE, num_tokens=32, num_seqs=4, max_blocks=6,
                                 num_logits=4)
        logits, kv = forward(loaded.params, kv, batch)
        for row, s in enumerate(order):
            done[s] += step[s]
            got, want = np.asarray(logits[row]), expected[s][done[s] - 1]
            if dtype == "float32":
                np.testing.assert_allclose(got, want, atol=F32_TOL, rtol=0, err_msg=f"sequence {s} step {step}")
            else:
                rel = np.abs(got - want).max() / np.abs(want).max()
                assert rel < BF16_REL_TOL, f"sequence {s} step {step}: bf16 relative error {rel:.4f}"
