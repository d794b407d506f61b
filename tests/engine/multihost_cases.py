"""The workload the multi-process tests run on every process and on one process alone."""

from __future__ import annotations

from jaxllm.sampling_params import SamplingParams

# few programs to compile; two long sequences do not fit the pool together (preemption)
ENGINE_ARGS = dict(skip_tokenizer=True, max_model_len=128, block_size=4, max_num_seqs=2, max_num_batched_tokens=8,
                   num_gpu_blocks=20)
SHARED = list(range(100, 120))  # a prefix several prompts share (prefix-cache hits)


def prompts() -> list[dict]:
    ids = [SHARED + list(range(5 + i, 10 + 3 * i)) if i % 2 else list(range(5 + i, 30 + 2 * i)) for i in range(4)]
    return [{"prompt_token_ids": p} for p in ids]


def sampling_params() -> list[SamplingParams]:
    """Greedy, and seeded sampling (its random stream must be the same on every process)."""
    return [SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=24, ignore_eos=True,
                           detokenize=False) for i in range(4)]
