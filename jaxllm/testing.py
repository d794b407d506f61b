"""Helpers that only tests use: kept out of the engine's modules so those hold only what the engine runs."""

from __future__ import annotations

from typing import Callable

from jaxllm.model.attention import ATTENTION_BACKENDS
from jaxllm.model.kernels import resolve_attention


def get_attention(name: str) -> Callable:
    """The attention implementation `name` ("auto" too) stands for on this machine."""
    return ATTENTION_BACKENDS[resolve_attention(name)]
