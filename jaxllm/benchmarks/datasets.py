"""Synthetic benchmark workloads: requests as (prompt token ids, output length) pairs."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np


def length_range(length: int, range_ratio: float) -> tuple[int, int]:
    """vLLM's random-dataset bounds: [int(length * (1 - r)), int(length * (1 + r))], at least 1 token."""
    return max(int(length * (1 - range_ratio)), 1), max(int(length * (1 + range_ratio)), 1)


def random_requests(num_prompts: int, input_len: int, output_len: int, range_ratio: float, vocab_size: int,
                    seed: int) -> list[tuple[list[int], int]]:
    """Prompts of uniformly random token ids in [0, vocab_size); lengths uniform (inclusive) in length_range.

    The same arguments always give the same requests (numpy's PCG64 seeded with `seed`).
    """
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    if min(num_prompts, input_len, output_len, vocab_size) < 1:
        raise ValueError("num_prompts, input_len, output_len and vocab_size must be >= 1")
    rng = np.random.default_rng(seed)
    input_lens = sample_lengths(rng, input_len, range_ratio, num_prompts)
    output_lens = sample_lengths(rng, output_len, range_ratio, num_prompts)
    return [(rng.integers(0, vocab_size, size=n).tolist(), int(m)) for n, m in zip(input_lens, output_lens)]


def sample_lengths(rng: np.random.Generator, length: int, range_ratio: float, n: int) -> np.ndarray:
    """[n] lengths drawn uniformly (inclusive) from length_range(length, range_ratio)."""
    low, high = length_range(length, range_ratio)
    return rng.integers(low, high + 1, size=n)


def mixed_lengths(rng: np.random.RandomState, num_requests: int = 128) -> list[tuple[int, int]]:
    """The mixed workload's (prompt tokens, output tokens) per request: each drawn uniformly in 16-256."""
    prompts, outputs = rng.randint(16, 257, size=num_requests), rng.randint(16, 257, size=num_requests)
    return [(int(p), int(o)) for p, o in zip(prompts, outputs)]


def dataset_name_arg(available: tuple[str, ...]) -> Callable[[str], str]:
    """An argparse `type` for --dataset-name: the name when `available` holds it; any other (vLLM's sharegpt, sonnet,
    hf, ...) is refused by name, with the datasets there are."""
    def check(name: str) -> str:
        if name in available:
            return name
        raise argparse.ArgumentTypeError(
            f"dataset {name!r} is not available: choose {' or '.join(available)} (synthetic prompts; vLLM's other "
            f"datasets, which read files or Hugging Face datasets, are not implemented)")
    return check
