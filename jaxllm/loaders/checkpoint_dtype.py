"""The dtype a checkpoint's weights are stored in, which `dtype="auto"` follows on a GPU.

    Hugging Face safetensors  the floating dtype of the weights (F32, F16, BF16), read from the file headers
    GGUF                      F32 -> float32, F16 -> float16, BF16 and every quantized type -> bfloat16
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from jaxllm.loaders.resolve import ModelSource

FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}  # the safetensors and GGUF type names
QUANTIZED_DTYPE = "bfloat16"  # what dequantized GGUF weights are computed in on a GPU


def auto_dtype(source: ModelSource) -> str:
    """The dtype most of the checkpoint's weights (by element count) are stored in, as a jaxllm dtype name."""
    if source.kind == "gguf":
        return _gguf_dtype(source.path)
    return _safetensors_dtype(Path(source.path))


def _safetensors_dtype(model_dir: Path) -> str:
    from safetensors import safe_open

    from jaxllm.loaders.safetensors import weight_files

    sizes: Counter[str] = Counter()
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                sizes[piece.get_dtype()] += math.prod(piece.get_shape())
    floating = [(n, d) for d, n in sizes.items() if d in FLOAT_DTYPES]
    return FLOAT_DTYPES[max(floating)[1]] if floating else "float32"


def _gguf_dtype(path: Path) -> str:
    from jaxllm.loaders.gguf import open_gguf

    sizes: Counter[str] = Counter()
    for tensor in open_gguf(path).tensors:
        sizes[tensor.type_name] += tensor.n_elements
    most = sizes.most_common(1)[0][0] if sizes else "F32"
    return FLOAT_DTYPES.get(most, QUANTIZED_DTYPE)
