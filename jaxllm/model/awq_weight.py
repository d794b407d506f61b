"""AWQWeight: a linear weight stored as packed int4 codes with per-group zero points and scales (AutoAWQ's AWQ).

It stands for the dense weight W [..., N, K] (the Hugging Face [out, in] layout every other weight has) and holds
the kernel layout of pallas_kernels/awq_matmul/layout.py, in which the output axis N is the *last* axis of every
leaf and the input axis K the one before it:

    qweight  int32 [..., K/8, N]   eight 4-bit codes of consecutive input rows per word
    zeros    int8  [..., K/G, N]   zero point of each group of G input rows
    scales   fp16  [..., K/G, N]   scale of each group (the checkpoint's dtype is kept)

So selecting output rows (the tensor-parallel layout, fused q|k|v per KV head group) indexes the last axis, fusing
concatenates on it, and a row-parallel split of K splits the word and group axes (tensor_parallel refuses sizes
where a group of G rows would straddle two devices). The leaves stay packed on the device; `dot` runs the Pallas
dequantize-matmul kernel or its plain-jnp reference, as Kernels.awq_matmul says (model/kernels.py).
"""

from __future__ import annotations

import jax
import numpy as np

from jaxllm.model.kernels import Kernels
from jaxllm.model.weights import Axes, WeightFormat
from pallas_kernels.awq_matmul import AWQPacked, awq_matmul, awq_matmul_reference


class AWQWeight(WeightFormat):
    qweight: jax.Array  # [..., K/8, N] int32
    zeros: jax.Array  # [..., K/G, N] int8
    scales: jax.Array  # [..., K/G, N] float16

    @classmethod
    def from_packed(cls, packed: AWQPacked) -> AWQWeight:
        return cls(qweight=packed.qweight, zeros=packed.zeros, scales=packed.scales)

    @property
    def packed(self) -> AWQPacked:
        return AWQPacked(qweight=self.qweight, zeros=self.zeros, scales=self.scales)

    @property
    def shape(self) -> tuple[int, ...]:
        *lead, words, n = self.qweight.shape
        return (*lead, n, 8 * words)

    @property
    def group_size(self) -> int:
        return self.packed.group_size

    def dot(self, x: jax.Array, kernels: Kernels, live_rows: jax.Array | None = None) -> jax.Array:
        """x [..., K] -> x @ W.T [..., N] float32; one layer's leaves (no [L] axis). Every row is computed."""
        if kernels.awq_matmul == "pallas":
            return awq_matmul(x, self.packed, interpret=kernels.interpret)
        return awq_matmul_reference(x, self.packed)

    def take_rows(self, index: np.ndarray, axis: int) -> AWQWeight:
        index = np.asarray(index)
        return jax.tree.map(lambda leaf: leaf[..., index], self)  # W's rows are every leaf's last axis

    def concat_rows(self, others: list[AWQWeight], axis: int) -> AWQWeight:
        return jax.tree.map(lambda *leaves: np.concatenate(leaves, axis=-1), self, *others)

    def leaf_axes(self, axes: Axes) -> AWQWeight:
        *lead, rows, columns = axes  # the dense W [..., N, K]: rows name N, columns name K
        leaf = (*lead, columns, rows)  # every leaf is [..., K/8 or K/G, N]
        return AWQWeight(qweight=leaf, zeros=leaf, scales=leaf)

