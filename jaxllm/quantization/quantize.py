"""quantize_model: any model jaxllm loads -> an AWQ (GEMM, 4-bit, zero point) checkpoint directory.

    load (float32) -> calibration tokens -> embed them
    for each layer i:   TapStats of the float layer on what quantized layers 0 .. i-1 output   (AWQ)
                        scale search, folding, clipping, quantization                          (awq_layer.py)
                        the quantized layer's output becomes layer i + 1's input                (AWQ)
    write model.safetensors, config.json, generation_config.json, the tokenizer

Feeding each layer the quantized prefix's output (rather than the float model's) lets a layer's scales account
for the error already made upstream. RTN skips the calibration entirely.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from jaxllm.config import ModelConfig
from jaxllm.loaders import LoadedModel, load_host_model, resolve_model
from jaxllm.loaders.resolve import ModelSource
from jaxllm.model.params import checkpoint_layer_shapes
from jaxllm.quantization import calibration
from jaxllm.quantization.awq_layer import METHODS, quantize_layer
from jaxllm.quantization.checkpoint import (LINEAR_NAMES, dense_layer_names, global_tensors, layer_tensors,
                                           write_checkpoint)

TOKENS_PER_CHUNK = 4096  # calibration tokens per forward call: bounds activation memory, not the calibration size
MAX_SEQ_LEN = 512
GROUP_SIZE_CANDIDATES = (16, 32, 64, 128, 256, 512, 1024)


@dataclasses.dataclass
class QuantizeSummary:
    output_dir: Path
    method: str
    group_size: int
    num_layers: int
    calibration_tokens: int
    seconds: float
    alphas: dict  # scale group -> the alpha chosen in each layer (AWQ)


AWQ_ARCHITECTURES = ("llama", "mistral", "qwen2")  # the layout quantization/dense_forward.py computes
NON_HF_ARCHITECTURES = ("llama", "mistral", "qwen2")  # the families checkpoint.hf_config_from writes a config for


def check_architecture(config, method: str, source_kind: str | None = None) -> None:
    """ValueError naming the family when it cannot be quantized by `method`: AWQ needs the calibration forward,
    which computes only the Llama layout (no sandwich or q/k norms, windows or soft-caps); RTN needs no forward,
    only linears the AutoAWQ format stores apart. source_kind: the source's kind when known (a config.json is
    written from scratch only for the Llama-layout families)."""
    family = config.architecture
    if config.num_experts:
        raise ValueError(f"quantizing a mixture-of-experts model ({family}) is not supported: jaxllm's quantizer "
                         "does not write int4 experts (AutoAWQ checkpoints of these models load)")
    if config.arch.fused_checkpoint:
        raise ValueError(f"AWQ checkpoints of {family} (fused qkv_proj / gate_up_proj linears) are not supported")
    if method == "awq" and (family not in AWQ_ARCHITECTURES or config.sliding_window is not None):
        window = f" with sliding_window {config.sliding_window}" if config.sliding_window else ""
        raise ValueError(f"--method awq: jaxllm's quantizer computes the calibration forward of "
                         f"{', '.join(AWQ_ARCHITECTURES)} models without a sliding window; this is a {family} "
                         f"model{window}. --method rtn (no calibration) quantizes it")
    if source_kind not in (None, "hf_dir") and family not in NON_HF_ARCHITECTURES:
        raise ValueError(f"quantizing a {family} model needs a Hugging Face directory (its config.json is kept); "
                         f"this one is a {source_kind} source")


def quantize_model(model: str | os.PathLike | None, output_dir: str | os.PathLike, method: str = "awq",
                   group_size: int = 128, calibration_file: str | os.PathLike | None = None, clip: bool = True,
                   n_grid: int = 20, max_calibration_tokens: int = 65536, progress: bool = True) -> QuantizeSummary:
    """Quantize `model` (None: the default model) into the new or empty directory `output_dir`. Bad arguments
    raise ValueError (or FileNotFoundError) before the model is loaded where they can be seen from its config."""
    check_method(method)
    output_dir = check_output_dir(output_dir)
    source = resolve_model(model)
    config = peek_config(source)
    if config is not None:
        check_architecture(config, method, source.kind)
        check_group_size(config, group_size)
    text = calibration.read_text(calibration_file) if method == "awq" else None
    loaded = load_host_model(model, "float32")
    check_group_size(loaded.config, group_size)
    from jaxllm.tokenizer import load_tokenizer

    return quantize_loaded(loaded, load_tokenizer(source), output_dir, method, group_size, text, clip, n_grid,
                           max_calibration_tokens, progress)


def quantize_loaded(loaded: LoadedModel, tokenizer, output_dir: Path, method: str, group_size: int,
                    text: str | None = None, clip: bool = True, n_grid: int = 20, max_calibration_tokens: int = 65536,
                    progress: bool = True) -> QuantizeSummary:
    """quantize_model's work on an already loaded model (host params) and its tokenizer; text: the calibration
    text (None: the built-in one)."""
    from tqdm.auto import tqdm

    from jaxllm.quantization.search import layer_tap_stats
    from jaxllm.quantization.dense_forward import embed_tokens, global_weights, layer_output, split_layers

    start = time.perf_counter()
    check_method(method)
    output_dir = check_output_dir(output_dir)
    config = loaded.config
    check_architecture(config, method, loaded.source.kind)
    check_group_size(config, group_size)
    layers, glob = split_layers(loaded.params, config), global_weights(loaded.params)
    dense_names = dense_layer_names(config)
    awq = method == "awq"
    xs, tokens = [], 0
    if awq:
        text = calibration.read_text(None) if text is None else text
        seqs = calibration.token_sequences(tokenizer, text, min(MAX_SEQ_LEN, config.max_position_embeddings),
                                           max_calibration_tokens, config.vocab_size)  # [S, T]
        xs, tokens = [embed_tokens(glob["embed"], c) for c in calibration.chunks(seqs, TOKENS_PER_CHUNK)], seqs.size
    tensors, alphas = {}, {}
    for i, w in enumerate(tqdm(layers, desc=f"{method.upper()} int4 g{group_size}", unit="layer",
                               disable=not progress)):
        stats = layer_tap_stats(w, xs, config) if awq else None
        layer = quantize_layer(w, stats, config, method, group_size, clip, n_grid)
        tensors.update(layer_tensors(i, layer.dense, layer.quantized, dense_names))
        for group, alpha in layer.alphas.items():
            alphas.setdefault(group, []).append(alpha)
        if awq and i + 1 < len(layers):
            dequantized = layer.dequantized(group_size)
            xs = [layer_output(dequantized, x, config) for x in xs]
    tensors.update(global_tensors(glob))
    write_checkpoint(output_dir, tensors, loaded.source, config, group_size, tokenizer)
    return QuantizeSummary(output_dir, method, group_size, len(layers), tokens, time.perf_counter() - start, alphas)


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown quantization method {method!r}; choose one of: {', '.join(METHODS)}")


def check_output_dir(output_dir: str | os.PathLike) -> Path:
    """The output directory (created when the checkpoint is written); an existing file or a non-empty directory
    is refused: nothing already there is overwritten."""
    path = Path(output_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"output directory {path} is an existing file")
    if path.is_dir() and any(path.iterdir()):
        raise ValueError(f"output directory {path} is not empty; give a new or empty directory")
    return path


def peek_config(source: ModelSource) -> ModelConfig | None:
    """The model's config without reading its weights (None for orbax checkpoints: checked after loading)."""
    if source.kind == "gguf":
        from jaxllm.loaders.gguf import gguf_config, open_gguf

        return gguf_config(open_gguf(source.path), source.path)
    if source.kind == "hf_dir":
        from jaxllm.loaders.safetensors import read_hf_config

        return read_hf_config(source.path)
    return None


def check_group_size(config: ModelConfig, group_size: int) -> None:
    """Every linear's K must split into whole groups and its N into whole 8-column words."""
    layer_shapes = checkpoint_layer_shapes(config)  # [N, K] each
    shapes = {name: layer_shapes[name][::-1] for name in LINEAR_NAMES}  # (K, N)
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group size must be a positive integer, got {group_size!r}")
    for name, (k, n) in shapes.items():
        where = f"model.layers.0.{LINEAR_NAMES[name]} (and the same linear of every layer)"
        if k % group_size:
            working = [g for g in GROUP_SIZE_CANDIDATES if all(kk % g == 0 for kk, _ in shapes.values())]
            raise ValueError(f"{where}: input size K = {k} is not a multiple of the group size {group_size}; group "
                             f"sizes that divide every layer's input size: {', '.join(map(str, working)) or 'none'}")
        if n % 8:
            raise ValueError(f"{where}: output size N = {n} is not a multiple of 8, which the packed int4 format needs")
