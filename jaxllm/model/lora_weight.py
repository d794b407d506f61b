"""LoRAWeight: a base weight (any format) plus, per token, the low-rank delta of that token's adapter.

    base         the base weight, any format (dense [..., N, K], AWQWeight, ...)
    a            [S, PR, K]   the A matrices of the S device slots (PR: the fused parts' padded ranks)
    b            [S, N, PR]   the B matrices, LoRA scaling folded in (jaxllm/lora/peft.py builds both)
    token_slots  [T] int32    each token's slot: 0 the base model, s the adapter in slot s (a[s-1], b[s-1])

    dot(x) = base.dot(x) + delta,  delta[t] = b[s-1] @ (a[s-1] @ x[t])     (s = token_slots[t] > 0)

The engine builds these inside its forward program (attach), from the params, the adapter slots and the step's
per-token slot ids; the layer code calls linear(x, w) as for any other weight. Under tensor parallelism b follows
the base weight's output rows (column-parallel q|k|v and gate|up: b split over N, a replicated) and a its input
columns (row-parallel o and down: a split over K, b replicated; the per-device partial deltas are summed by the
same all-reduce as the base's partial outputs, since b @ (sum_d a_d x_d) = sum_d b @ (a_d x_d)).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxllm.model import weights
from jaxllm.model.kernels import Kernels
from jaxllm.model.weights import Axes, WeightFormat
from pallas_kernels.lora import lora_delta, lora_delta_reference


class LoRAWeight(WeightFormat):
    base: Any
    a: jax.Array  # [S, PR, K]
    b: jax.Array  # [S, N, PR]
    token_slots: jax.Array  # [T] int32

    @property
    def shape(self) -> tuple[int, ...]:
        return self.base.shape

    def dot(self, x: jax.Array, kernels: Kernels, live_rows: jax.Array | None = None) -> jax.Array:
        """x [T, K] -> [T, N] float32 (the base's dot may skip the padding rows from live_rows on)."""
        return weights.dot(x, self.base, kernels, live_rows) + _delta(x, self.a, self.b, self.token_slots, kernels)

    def take_rows(self, index: np.ndarray, axis: int) -> LoRAWeight:
        return self.replace(base=weights.take_rows(self.base, index, axis),
                            b=weights.take_rows(self.b, index, axis + 1))  # b's N axis follows its S axis

    def leaf_axes(self, axes: Axes) -> LoRAWeight:
        rows, columns = axes  # the dense W [N, K]
        return LoRAWeight(base=weights.leaf_axes(self.base, axes), a=(None, None, columns), b=(None, rows, None),
                          token_slots=(None,))


def _delta(x: jax.Array, a: jax.Array, b: jax.Array, token_slots: jax.Array, kernels: Kernels) -> jax.Array:
    """[T, N] float32: the Pallas kernel or the jnp reference, as Kernels.lora_matmul says."""
    if kernels.lora_matmul == "pallas":
        return lora_delta(x, a, b, token_slots, interpret=kernels.interpret)
    return lora_delta_reference(x, a, b, token_slots)


def attach(params, slots, token_slots: jax.Array):
    """params whose layers' linear fields carry the adapters: slots[layer] maps a field to that layer's
    (a [S, PR, K], b [S, N, PR]) (lora/device_slots.py); token_slots [T] is every layer's."""
    def with_adapters(layer, layer_slots):
        return layer.replace(**{name: LoRAWeight(base=getattr(layer, name), a=a, b=b, token_slots=token_slots)
                                for name, (a, b) in layer_slots.items()})

    return params.replace(layers=tuple(map(with_adapters, params.layers, slots)))
