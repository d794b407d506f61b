"""Quality check of the quantizers: held-out perplexity of float32, AWQ and RTN weights at one group size.

The quantized perplexities are computed from the written checkpoints, read back and dequantized with the format's
unpacker (checkpoint.read_dequantized), so they measure what a loader of the files gets. The held-out text
(calibration.HELD_OUT_TEXT) shares nothing with the calibration text. Used by benchmarks/awq_quality.py and the
quality test.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path

import numpy as np

from jaxllm.config import ModelConfig
from jaxllm.loaders import load_host_model
from jaxllm.quantization import calibration
from jaxllm.quantization.checkpoint import read_dequantized
from jaxllm.quantization.dense_forward import embed_tokens, global_weights, layer_output, next_token_nll, split_layers
from jaxllm.quantization.quantize import check_group_size, quantize_loaded

EVAL_SEQ_LEN = 512
TOKENS_PER_CHUNK = 2048  # the logits of a chunk are [tokens, V] float32: 400 MB at V = 49152


@dataclasses.dataclass
class QualityReport:
    group_size: int
    eval_tokens: int
    perplexity: dict  # "float32" | "awq" | "rtn" -> perplexity
    seconds: dict  # "load" | "float32" | each method's quantization -> seconds (quantizing includes writing)

    def lines(self) -> list[str]:
        base = self.perplexity["float32"]
        out = [f"held-out tokens: {self.eval_tokens}, group size {self.group_size}"]
        for name, ppl in self.perplexity.items():
            change = "" if name == "float32" else f"  ({100 * (ppl / base - 1):+.2f}% vs float32)"
            out.append(f"{name:>8}: perplexity {ppl:.3f}{change}")
        return out


def perplexity(glob: dict, layers: list[dict], config: ModelConfig, sequences: np.ndarray) -> float:
    """exp(mean next-token NLL) over every position but the last of each sequence [S, T], from float weights
    (dense_forward.split_layers / checkpoint.read_dequantized dicts)."""
    head = glob.get("lm_head", glob["embed"])  # [V, H]; tied models use the embedding
    total, count = 0.0, 0
    for tokens in calibration.chunks(sequences, TOKENS_PER_CHUNK):
        x = embed_tokens(glob["embed"], tokens)  # [B, T, H]
        for w in layers:
            x = layer_output(w, x, config)
        nll = next_token_nll(glob["final_norm"], head, x, tokens, config.rms_norm_eps)  # [B, T-1]
        total += float(np.asarray(nll, dtype=np.float64).sum())
        count += nll.size
    return math.exp(total / count)


def held_out_sequences(tokenizer, config: ModelConfig) -> np.ndarray:
    text = calibration.HELD_OUT_TEXT.read_text(encoding="utf-8")
    seq_len = min(EVAL_SEQ_LEN, config.max_position_embeddings)
    return calibration.token_sequences(tokenizer, text, seq_len, 1 << 20, config.vocab_size)


def compare_perplexity(model: str | os.PathLike | None, workdir: str | os.PathLike, group_size: int = 64,
                       methods: tuple[str, ...] = ("awq", "rtn"), progress: bool = True, **options) -> QualityReport:
    """Quantize `model` with each method into workdir/<method> and compare held-out perplexities with float32.
    options: quantize_loaded's keyword arguments (clip, n_grid, max_calibration_tokens, text)."""
    from jaxllm.tokenizer import load_tokenizer

    start = time.perf_counter()
    loaded = load_host_model(model, "float32")
    check_group_size(loaded.config, group_size)
    tokenizer = load_tokenizer(loaded.source)
    sequences = held_out_sequences(tokenizer, loaded.config)
    seconds = {"load": time.perf_counter() - start}
    start = time.perf_counter()
    layers, glob = split_layers(loaded.params, loaded.config), global_weights(loaded.params)
    ppl = {"float32": perplexity(glob, layers, loaded.config, sequences)}
    seconds["float32"] = time.perf_counter() - start
    del layers, glob
    for method in methods:
        start = time.perf_counter()
        out = Path(workdir) / method
        quantize_loaded(loaded, tokenizer, out, method, group_size, progress=progress, **options)
        seconds[method] = time.perf_counter() - start
        hf, q_glob, q_layers = read_dequantized(out)
        ppl[method] = perplexity(q_glob, q_layers, ModelConfig.from_hf_config(hf), sequences)
    return QualityReport(group_size, int(sequences.size), ppl, seconds)
