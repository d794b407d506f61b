"""Weight formats: the one place that knows how a linear layer's weight is stored and multiplied.

Layer code calls layers.linear(x, w) and never asks what `w` is. A dense weight is a plain array [N, K] (the Hugging
Face [out, in] layout, as loaders and checkpoints store it). Every other format (packed int4 with scales, a weight
with a LoRA delta, ...) is a WeightFormat subclass: a pytree whose leaves are arrays. A weight is one layer's
(model/params.py keeps each layer's arrays apart); leaves may carry leading axes where a caller batches several.

A format answers these questions, and the module functions below ask them of dense arrays and formats alike:
    dot(x, w, kernels)      x [..., K] -> [..., N] float32: the matmul, accumulated in float32, with the
                            implementation model/kernels.py chose where a format has a kernel; `live_rows` (an
                            int32 scalar) says that x's rows from it on are a bucket's padding, which a format may
                            skip (TiledWeight's kernel does: zeros there; the others compute them)
    take_rows(w, index, a)  w with its output rows (on axis a) selected in `index` order: the tensor-parallel
                            shard-major layout, computed once as a row index, lays out any format
    concat_rows(ws, a)      weights of one format joined along their output rows: q|k|v and gate|up fused
    leaf_axes(w, axes)      the logical axis names of each of w's leaves, given those of the dense weight: the
                            sharding rules table (tensor_parallel.PARAM_AXES) then places any format's leaves
    w.shape                 the dense weight's shape [..., N, K] (loaders check it against the config)

`stack(ws)` stacks weights of one format on a new leading axis of every leaf (a MoE layer's [E, ...] expert
stacks): valid for a format whose methods read its leaves from the last axes, as AWQWeight's do.

`TiledWeight` (below) is a dense bfloat16 weight stored as AMX tiles, for the tiled kernel: the LM head and the
layers' dense linears take it on a CPU with AMX or AVX512-BF16 (model/tiled_params.py), where a tied head also
serves the embedding lookup (`embedding_rows`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxllm.model.host_arrays import aligned_concatenate
from jaxllm.model.kernels import REFERENCE, Kernels
from pallas_kernels.amx_matmul.cpu import tiled_matmul_cpu, tiled_silu_matmul_cpu
from pallas_kernels.amx_matmul.reference import TILE, tiled_dot, tiled_rows
from pallas_kernels.skinny_matmul.cpu import skinny_matmul, skinny_supports

Axes = tuple  # logical axis names of one array, e.g. ("layers", "heads", "embed")
TILED_SKINNY_MAX_ROWS = 2  # a tiled weight's dot with this many rows or fewer: the skinny kernel (RESULTS.md)


class WeightFormat(struct.PyTreeNode):
    """Base of the non-dense formats. Subclasses declare their array fields (each a leaf, as in a flax struct
    dataclass) and implement the three methods; a format stands for a dense weight [..., N, K]."""

    def dot(self, x: jax.Array, kernels: Kernels, live_rows: jax.Array | None = None) -> jax.Array:
        """x [..., K] -> x @ W.T [..., N] in float32 (live_rows: the module docstring's)."""
        raise NotImplementedError(f"{type(self).__name__}.dot")

    def take_rows(self, index: np.ndarray, axis: int) -> WeightFormat:
        """The same format standing for W's rows `index` on `axis` (the N axis: 0 for one layer's [N, K])."""
        raise NotImplementedError(f"{type(self).__name__}.take_rows")

    def concat_rows(self, others: list[WeightFormat], axis: int) -> WeightFormat:
        """[self, *others] (all of this class) joined on the dense W's row axis `axis` (host numpy leaves)."""
        raise NotImplementedError(f"{type(self).__name__}.concat_rows")

    def leaf_axes(self, axes: Axes) -> WeightFormat:
        """The same class with each leaf replaced by its logical axis names; `axes` are the dense W's."""
        raise NotImplementedError(f"{type(self).__name__}.leaf_axes")

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the dense weight this stands for, [..., N, K]."""
        raise NotImplementedError(f"{type(self).__name__}.shape")


class TiledWeight(WeightFormat):
    """A dense bfloat16 weight W [N, K] stored as AMX tiles, `tiles` [N/32, K/32, 2, 16, 32]
    (pallas_kernels/amx_matmul: a block of 32 rows is one contiguous run in the order the kernel reads it). Its
    dot runs the skinny kernel on the tiles for at most TILED_SKINNY_MAX_ROWS rows of x where Kernels.matvec16 is
    "native", the tiled kernel (AMX, else AVX512-BF16) where Kernels.amx_matmul is "cpu", else the jnp contract
    (the tiles laid back out). Where the tiled kernel runs, a dot can also store its sums rounded to bfloat16
    (`rounded_dot`), and a gate|up weight's dot end in the gated MLP's SiLU (`silu_and_mul`)."""
    tiles: jax.Array

    def dot(self, x: jax.Array, kernels: Kernels, live_rows: jax.Array | None = None) -> jax.Array:
        if self._takes_skinny(x, kernels):
            return skinny_matmul(x, self.tiles)
        if self._takes_tiled_kernel(x, kernels):
            return tiled_matmul_cpu(x, self.tiles, live_rows)
        return tiled_dot(x, self.tiles)

    def silu_and_mul(self, x: jax.Array, kernels: Kernels, live_rows: jax.Array | None = None) -> jax.Array | None:
        """For a gate|up weight [2F, K]: silu(gate) * up [..., F] bfloat16 in one native call, the activation in the
        dot's epilogue, where its dot would run the tiled kernel and F is a multiple of 32; else None."""
        if not self._takes_tiled_kernel(x, kernels) or self.tiles.shape[0] % 2:
            return None
        return tiled_silu_matmul_cpu(x, self.tiles, live_rows)

    def rounded_dot(self, x: jax.Array, kernels: Kernels, live_rows: jax.Array | None = None) -> jax.Array | None:
        """dot's sums rounded to bfloat16 [..., N] as the tiled kernel stores them (bit for bit their astype, with no
        pass of its own), where the dot would run the tiled kernel; else None."""
        if not self._takes_tiled_kernel(x, kernels):
            return None
        return tiled_matmul_cpu(x, self.tiles, live_rows, jnp.bfloat16)

    def _takes_skinny(self, x: jax.Array, kernels: Kernels) -> bool:
        return kernels.matvec16 == "native" and _rows(x) <= TILED_SKINNY_MAX_ROWS and skinny_supports(x, self.tiles)

    def _takes_tiled_kernel(self, x: jax.Array, kernels: Kernels) -> bool:
        """Whether the dot runs the tiled kernel (its few-row dots take the skinny kernel first)."""
        return kernels.amx_matmul == "cpu" and x.dtype == jnp.bfloat16 and not self._takes_skinny(x, kernels)

    def leaf_axes(self, axes: Axes) -> TiledWeight:
        rows, columns = axes  # the dense W [N, K]: the tiles are [N/32, K/32, 2, 16, 32]
        return TiledWeight(tiles=(rows, columns, "tile_half", "tile_row", "tile_column"))

    def rows(self, index: jax.Array) -> jax.Array:
        """W[index] [..., K]: an embedding lookup of a tied head."""
        return tiled_rows(self.tiles, index)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tiles.shape[0] * TILE, self.tiles.shape[1] * TILE

    @property
    def dtype(self):
        return self.tiles.dtype


def embedding_rows(embed: Any, token_ids: jax.Array) -> jax.Array:
    """embed[token_ids] [T, H] for a dense table [V, H] or one stored as tiles (a tied LM head's)."""
    return embed.rows(token_ids) if isinstance(embed, TiledWeight) else embed[token_ids]


def fused_silu_and_mul(x: jax.Array, w_gate_up: Any, kernels: Kernels = REFERENCE,
                       live_rows: jax.Array | None = None) -> jax.Array | None:
    """silu(gate) * up [..., F] in x.dtype straight from x where w_gate_up's format fuses the activation into its
    dot (TiledWeight.silu_and_mul); None where the caller takes the dot's sums and the activation apart."""
    return w_gate_up.silu_and_mul(x, kernels, live_rows) if isinstance(w_gate_up, TiledWeight) else None


def rounded_dot(x: jax.Array, w: Any, kernels: Kernels = REFERENCE,
                live_rows: jax.Array | None = None) -> jax.Array | None:
    """dot(x, w) rounded to x.dtype [..., N] by the dot itself where w's format does that (TiledWeight.rounded_dot);
    None where the caller rounds dot's float32 sums."""
    return w.rounded_dot(x, kernels, live_rows) if isinstance(w, TiledWeight) else None


def dot(x: jax.Array, w: Any, kernels: Kernels = REFERENCE, live_rows: jax.Array | None = None) -> jax.Array:
    """x [..., K] @ w.T -> [..., N] float32, whatever w's format (live_rows: the module docstring's)."""
    if isinstance(w, WeightFormat):
        return w.dot(x, kernels, live_rows)
    if kernels.matvec16 == "native" and _takes_skinny(x, w):
        return skinny_matmul(x, w)
    if kernels.matvec16 in ("two_rows", "native") and w.ndim == 2 and w.dtype.itemsize == 2 and _rows(x) == 1:
        return _two_row_dot(x, w)
    return dense_dot(x, w)


def _rows(x: jax.Array) -> int:
    return math.prod(x.shape[:-1])


def _takes_skinny(x: jax.Array, w: jax.Array) -> bool:
    """Whether the native skinny kernel runs this dense dot: a 2-D w with at most its MAX_ROWS rows of x, except
    a one-row dot with a float32 w, which XLA already runs at the weight-read rate (benchmarks/RESULTS.md)."""
    return skinny_supports(x, w) and (w.dtype.itemsize == 2 or _rows(x) >= 2)


def dense_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., K] @ w[N, K].T -> [..., N], accumulated in float32 (w stored [N, K] is the fast layout on CPU)."""
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (w.ndim - 1,)), ((), ())), preferred_element_type=jnp.float32)


def _two_row_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """dense_dot of a single row x [..., K] (one row in all) with a 16-bit w, as a two-row product: XLA:CPU runs
    a one-row dot with a 16-bit weight by converting the whole weight to float32 first (12x slower for the
    default model's batch-1 decode step), a two-row one as a matrix product on the 16-bit weight."""
    rows = jnp.concatenate([x.reshape(1, -1), jnp.zeros((1, x.shape[-1]), x.dtype)])  # [2, K]: x, zeros
    rows = jax.lax.optimization_barrier(rows)  # else XLA folds the zero row away and is back at one row
    return dense_dot(rows, w)[0].reshape(*x.shape[:-1], w.shape[-2])


def take_rows(w: Any, index: np.ndarray, axis: int) -> Any:
    """w with the rows `index` (host ints, repeats allowed) of its `axis`; numpy stays numpy, a device array stays
    on its device."""
    if isinstance(w, WeightFormat):
        return w.take_rows(index, axis)
    return w[(slice(None),) * axis + (np.asarray(index),)]


def concat_rows(parts: list, axis: int) -> Any:
    """Weights of one format (host numpy leaves) joined along the dense W's row axis `axis`; TypeError naming the
    formats when they differ (a fused projection cannot mix, say, packed int4 and dense parts)."""
    kinds = {format_name(p) for p in parts}
    if len(kinds) > 1:
        raise TypeError(f"cannot fuse weights of different formats: {', '.join(sorted(kinds))}")
    if isinstance(parts[0], WeightFormat):
        return parts[0].concat_rows(list(parts[1:]), axis)
    return aligned_concatenate(parts, axis)


def stack(parts: list) -> Any:
    """Weights of one format and shape (host numpy leaves) stacked on a new leading axis: each leaf gains it (the
    [E, ...] expert stacks); TypeError naming the formats when they differ."""
    kinds = {format_name(p) for p in parts}
    if len(kinds) > 1:
        raise TypeError(f"cannot stack weights of different formats: {', '.join(sorted(kinds))}")
    return jax.tree.map(lambda *leaves: np.stack(leaves), *parts)


def format_name(w: Any) -> str:
    """A WeightFormat's class name, or "dense" for an array of any kind (numpy, memory-mapped, jax)."""
    return type(w).__name__ if isinstance(w, WeightFormat) else "dense"


def leaf_axes(w: Any, axes: Axes) -> Any:
    """A pytree shaped like w whose leaves are the logical axis names of w's leaves (map over it with
    is_leaf=is_axes: a tuple of names is one leaf)."""
    if isinstance(w, WeightFormat):
        return w.leaf_axes(axes)
    return tuple(axes)


def is_axes(node: Any) -> bool:
    return isinstance(node, tuple)
