"""One decoder layer through AWQ (scale search, folding, clipping, quantization) or plain round-to-nearest.

Scaling groups: linears that read the same input share one scale vector s [K]; their weight columns are multiplied
by s and the op that produces the input divides by s, so the float function is unchanged and only the rounding
differs:

    group        linears         input produced by          1/s folded into
    qkv          q, k, v         the attention RMSNorm      input_layernorm.weight
    o            o               attention over v           v's output rows (and bias): MHA only, where v's
                                                            outputs feed o one to one (AutoAWQ skips GQA too)
    gate_up      gate, up        the MLP RMSNorm            post_attention_layernorm.weight
    down         down            silu(gate) * up            up's output rows

Then every linear but q and k (whose errors go through the softmax; AutoAWQ skips them too) gets a clipping
search, and all seven are quantized. RTN does the last step only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxllm.config import ModelConfig
from jaxllm.quantization.dense_forward import TAPS
from jaxllm.quantization.group_quant import clip_groups, dequantize_groups, quantize_groups
from jaxllm.quantization.search import TapStats, search_clip, search_scales

LINEARS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
UNCLIPPED = ("wq", "wk")
METHODS = ("awq", "rtn")
_TAP_OF = {linear: tap for tap, linears in TAPS.items() for linear in linears}


@dataclasses.dataclass(frozen=True)
class ScaleGroup:
    tap: str  # dense_forward.TAPS key: the input the group's linears share
    linears: tuple[str, ...]
    fold_norm: str | None = None  # an RMSNorm weight [K] divided by s ...
    fold_rows: tuple[str, ...] = ()  # ... or the previous linear's output rows (weight [K, .], bias [K])


@dataclasses.dataclass
class QuantizedLayer:
    dense: dict  # norms and biases (scales folded in), float32
    quantized: dict  # linear name -> (codes int32 [N, K], zero points int32 [N, K/G], scales float32 [N, K/G])
    alphas: dict  # scale group -> the alpha the search chose (AWQ only)

    def dequantized(self, group_size: int) -> dict:
        """The layer's float weights as its checkpoint will dequantize to (the next layer's calibration input)."""
        linears = {name: dequantize_groups(*qz, group_size) for name, qz in self.quantized.items()}
        return {**self.dense, **linears}


def scale_groups(config: ModelConfig) -> list[ScaleGroup]:
    groups = [ScaleGroup("qkv", ("wq", "wk", "wv"), fold_norm="attn_norm")]
    if config.num_heads == config.num_kv_heads:  # v's output rows are o's input columns, one to one
        groups.append(ScaleGroup("o", ("wo",), fold_rows=("wv", "bv")))
    groups.append(ScaleGroup("gate_up", ("w_gate", "w_up"), fold_norm="mlp_norm"))
    groups.append(ScaleGroup("down", ("w_down",), fold_rows=("w_up",)))
    return groups


def quantize_layer(w: dict, stats: dict[str, TapStats] | None, config: ModelConfig, method: str, group_size: int,
                   clip: bool = True, n_grid: int = 20) -> QuantizedLayer:
    """w: the layer's float32 weights (dense_forward.py names); stats: the calibration TapStats of each tap (AWQ
    only). Returns the folded dense weights and the quantized linears."""
    if method not in METHODS:
        raise ValueError(f"unknown quantization method {method!r}; choose one of {', '.join(METHODS)}")
    w = {name: jnp.asarray(value, jnp.float32) for name, value in w.items()}
    alphas = {}
    if method == "awq":
        grams = {linear: stats[_TAP_OF[linear]].gram for linear in LINEARS}  # [K, K] of each linear's input
        for group in scale_groups(config):
            s, alpha, _ = search_scales(jnp.concatenate([w[n] for n in group.linears]), stats[group.tap].gram,
                                        stats[group.tap].mean_abs, group_size, n_grid)
            alphas[group.tap] = float(alpha)
            _fold(w, group, s)
            for name in group.linears:  # the input is now x / s
                grams[name] = grams[name] / jnp.outer(s, s)
        if clip:
            for name in LINEARS:
                if name not in UNCLIPPED:
                    w[name] = clip_groups(w[name], search_clip(w[name], grams[name], group_size), group_size)
    quantized = {name: quantize_groups(w[name], group_size) for name in LINEARS}
    dense = {name: value for name, value in w.items() if name not in LINEARS}
    return QuantizedLayer(dense, quantized, alphas)


def _fold(w: dict, group: ScaleGroup, s: jax.Array) -> None:
    """Scale the group's weight columns by s [K] and divide its input's producer by s, in place."""
    for name in group.linears:
        w[name] = w[name] * s[None, :]
    if group.fold_norm:
        w[group.fold_norm] = w[group.fold_norm] / s
    for name in group.fold_rows:
        if name in w:
            w[name] = w[name] / (s[:, None] if w[name].ndim == 2 else s)
