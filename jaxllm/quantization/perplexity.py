"""Perplexity of float weights (layer_weights.py / checkpoint.read_dequantized dicts) on token sequences."""

from __future__ import annotations

import math

import numpy as np

from jaxllm.config import ModelConfig
from jaxllm.quantization.calibration import chunks
from jaxllm.quantization.dense_forward import embed_tokens, layer_output, next_token_nll

TOKENS_PER_CHUNK = 2048  # the logits of a chunk are [tokens, V] float32: 400 MB at V = 49152


def perplexity(glob: dict, layers: list[dict], config: ModelConfig, sequences: np.ndarray) -> float:
    """exp(mean next-token NLL) over every position but the last of each sequence [S, T]."""
    head = glob.get("lm_head", glob["embed"])  # [V, H]; tied models use the embedding
    total, count = 0.0, 0
    for tokens in chunks(sequences, TOKENS_PER_CHUNK):
        x = embed_tokens(glob["embed"], tokens)  # [B, T, H]
        for w in layers:
            x = layer_output(w, x, config)
        nll = next_token_nll(glob["final_norm"], head, x, tokens, config.rms_norm_eps)  # [B, T-1]
        total += float(np.asarray(nll, dtype=np.float64).sum())
        count += nll.size
    return math.exp(total / count)
