"""A minimal greedy generation loop over the paged forward: an independent oracle for the engine tests.

All prompts run together: one prefill step, then one decode step per new token. Each sequence owns a contiguous
run of blocks; finished sequences keep decoding into their own blocks until every sequence is done, so the step
shapes never change and exactly two programs are compiled (prefill, decode).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxllm.loaders import LoadedModel
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward
from jaxllm.model.params import params_dtype


def greedy_generate(
    loaded: LoadedModel,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    *,
    block_size: int = 16,
    stop_token_ids: Sequence[int] = (),
) -> list[list[int]]:
    """New token ids per prompt (argmax decoding; a sequence stops at a stop token or after max_tokens)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token id lists")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    config = loaded.config
    longest = max(len(p) for p in prompts) + max_tokens
    if longest > config.max_position_embeddings:
        raise ValueError(f"prompt + max_tokens = {longest} tokens exceeds the model's context of "
                         f"{config.max_position_embeddings}")
    blocks_per_seq = -(-longest // block_size)
    tables = [list(range(1 + i * blocks_per_seq, 1 + (i + 1) * blocks_per_seq)) for i in range(len(prompts))]
    kv = init_kv_cache(config, 1 + len(prompts) * blocks_per_seq, block_size, params_dtype(loaded.params))
    forward = jit_forward(config)

    total = sum(len(p) for p in prompts)
    batch = build_step_batch([SequenceChunk(p, 0, t) for p, t in zip(prompts, tables)], block_size,
                             num_tokens=_pow2_at_least(total))
    outputs: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    stops = set(stop_token_ids)
    for _ in range(max_tokens):
        logits, kv = forward(loaded.params, kv, batch)
        next_ids = np.asarray(logits.argmax(-1))  # [S]
        for i, token in enumerate(next_ids.tolist()):
            if not done[i]:
                outputs[i].append(token)
                done[i] = token in stops or len(outputs[i]) == max_tokens
        if all(done):
            break
        # every sequence feeds its last token; a finished one rewrites the same slot with the same K/V
        chunks = [SequenceChunk([o[-1]], len(p) + len(o) - 1, t) for p, o, t in zip(prompts, outputs, tables)]
        batch = build_step_batch(chunks, block_size, max_blocks=blocks_per_seq)
    return outputs


def _pow2_at_least(n: int, minimum: int = 16) -> int:
    return max(minimum, 1 << (n - 1).bit_length())
