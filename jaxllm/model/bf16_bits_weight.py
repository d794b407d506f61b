"""BFloat16Bits: a dense bfloat16 linear weight [..., N, K] held as its uint16 bits, for the CPU.

XLA:CPU has bfloat16 matmuls (oneDNN / AMX, several times float32's rate where the CPU has them) but no bfloat16
dynamic-slice: the layer scan's per-layer slice of a bfloat16 [L, N, K] weight becomes a float32 conversion of
every layer's weights, hoisted out of the loop and paid at every step (a decode step spent 3/4 of its time
there). Sliced as integers and bitcast back to bfloat16 at the dot, the same weights cost nothing extra.
place_params holds a CPU model's bfloat16 linear weights this way; save_checkpoint writes them back dense.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxllm.model.params import LINEAR_FIELDS
from jaxllm.model.weights import Axes, WeightFormat, dense_dot


class BFloat16Bits(WeightFormat):
    bits: jax.Array  # [..., N, K] uint16: the bfloat16 weight's bits

    def dot(self, x: jax.Array) -> jax.Array:
        return dense_dot(x, self.dense())

    def dense(self) -> jax.Array:
        """The bfloat16 weight [..., N, K] (numpy bits give a numpy array)."""
        if isinstance(self.bits, np.ndarray):
            return self.bits.view(jnp.bfloat16)
        return jax.lax.bitcast_convert_type(self.bits, jnp.bfloat16)

    def take_rows(self, index: np.ndarray, axis: int) -> BFloat16Bits:
        return BFloat16Bits(bits=self.bits[(slice(None),) * axis + (np.asarray(index),)])

    def concat_rows(self, others: list[BFloat16Bits], axis: int) -> BFloat16Bits:
        return BFloat16Bits(bits=np.concatenate([self.bits, *(o.bits for o in others)], axis=axis))

    def leaf_axes(self, axes: Axes) -> BFloat16Bits:
        return BFloat16Bits(bits=tuple(axes))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.bits.shape)


def hold_as_bits(params):
    """params with each dense bfloat16 linear layer weight as BFloat16Bits (host numpy stays numpy)."""
    def as_bits(w):
        if isinstance(w, WeightFormat) or jnp.dtype(w.dtype) != jnp.bfloat16:
            return w
        bits = w.view(np.uint16) if isinstance(w, np.ndarray) else jax.lax.bitcast_convert_type(w, jnp.uint16)
        return BFloat16Bits(bits=bits)

    layers = params.layers
    return params.replace(layers=layers.replace(**{f: as_bits(getattr(layers, f)) for f in LINEAR_FIELDS}))


def dense_weights(params):
    """params with every BFloat16Bits weight back as its dense bfloat16 array."""
    return jax.tree.map(lambda w: w.dense() if isinstance(w, BFloat16Bits) else w, params,
                        is_leaf=lambda w: isinstance(w, BFloat16Bits))
