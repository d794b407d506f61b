"""The flags of `jaxllm quantize` (the handler is entrypoints/cli.py's; the work is quantize.py's).

Imports nothing heavy: building the parser must not import jax.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_MODEL_NAME = "default"

QUANTIZE_DESCRIPTION = """Quantize a model's linear weights to 4-bit integers with a zero point per group of input
channels, and write an AutoAWQ GEMM checkpoint (model.safetensors with qweight/qzeros/scales, config.json with
quantization_config, the tokenizer, generation_config.json) that jaxllm and other AWQ loaders read. --method awq
searches per-input-channel scales on calibration activations (Lin et al. 2023) and clipping ranges; --method rtn
rounds to nearest. MODEL is anything jaxllm loads (a .gguf file, an HF directory, an HF id in the local cache, an
orbax checkpoint); omit it or write "default" for the default model (SmolLM2-135M-Instruct, whose input sizes
576 and 1536 need a group size of 64 or less)."""


def add_quantize_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("model", nargs="?", default=None, metavar="MODEL",
                        help='the model to quantize (omitted or "default": the default model)')
    parser.add_argument("output_dir", metavar="OUTPUT_DIR", help="a new or empty directory for the checkpoint")
    parser.add_argument("--method", choices=("awq", "rtn"), default="awq",
                        help="awq (default): activation-aware scales and clipping (Llama, Mistral without a window, Qwen2); "
                        "rtn: round to nearest (also Qwen3, Gemma 2 and 3, windowed Mistral)")
    parser.add_argument("--group-size", type=int, default=128,
                        help="input channels per scale and zero point (default 128); must divide every linear's "
                        "input size")
    parser.add_argument("--calibration", metavar="FILE", default=None,
                        help="UTF-8 text to calibrate AWQ on (default: a short built-in English and Python text)")
    parser.add_argument("--max-calibration-tokens", type=int, default=65536,
                        help="use at most this many tokens of the calibration text (default 65536)")
    parser.add_argument("--no-clip", dest="clip", action="store_false",
                        help="AWQ without the clipping search (scales only)")
    parser.add_argument("--grid", type=int, default=20,
                        help="candidate exponents alpha = 0, 1/GRID, ... of the scale search (default 20)")
    return parser


def model_argument(model: str | None) -> str | None:
    """None for the default model: MODEL omitted, or "default" when no such file or directory exists."""
    if model is None or (model == DEFAULT_MODEL_NAME and not Path(model).exists()):
        return None
    return model
