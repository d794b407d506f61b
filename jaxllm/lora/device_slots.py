"""The adapters' device slots: per layer and linear field, the A and B matrices of max_loras adapters.

    slots[layer][field] = (a [S, PR, K], b [S, N, PR])    S = max_loras; the slot a token names is 1..S (0: none)

One pair of arrays per layer, as the base weights are (model/params.py), so the forward reads them where they lie.

Owned by the runner (device arrays), written one adapter at a time between steps by one compiled program
(the slot is a traced index, so any slot and any adapter reuse it), read by the forward program (LoRAWeight).
Under tensor parallelism the slots are split like their base weights (lora_weight.py): b's rows of the fused
fields are laid out shard-major as the base weights are (tensor_parallel.qkv_rows, gate_up_rows).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jaxllm.config import ModelConfig
from jaxllm.lora.peft import HostAdapter, field_shapes
from jaxllm.model import tensor_parallel

LayerSlots = dict  # LayerParams field -> (a [S, PR, K], b [S, N, PR]) of one layer
SlotArrays = tuple  # one LayerSlots per layer


def slot_shapes(config: ModelConfig, max_loras: int, max_rank: int, tp_size: int | None = None
                ) -> dict[str, tuple[tuple, tuple]]:
    """Per field: the shapes of one layer's (a, b), [S, PR, K] and [S, N, PR]; N counts the tensor-parallel
    layout's rows (KV heads replicated over devices repeat their rows)."""
    rows = _laid_out_rows(config, tp_size)
    return {field: ((max_loras, *a[1:]), (max_loras, len(rows[field]) if field in rows else b[1], b[2]))
            for field, (a, b) in field_shapes(config, max_rank).items()}


def slot_bytes(config: ModelConfig, max_loras: int, max_rank: int, itemsize: int, tp_size: int = 1) -> int:
    """Bytes of the slots on one device (an upper bound: every leaf counted as if split over tp_size)."""
    total = 0
    for a, b in slot_shapes(config, max_loras, max_rank, tp_size).values():
        total += (int(np.prod(a)) + int(np.prod(b))) * itemsize
    return -(-total * config.num_layers // tp_size)


def slot_shardings(mesh: Mesh, num_layers: int) -> SlotArrays:
    """Each layer's and field's (a, b) shardings: b split over the base weight's output rows, a over its input
    columns."""
    shardings = {}
    for field in ("w_qkv", "wo", "w_gate_up", "w_down"):
        rows, columns = tensor_parallel.PARAM_AXES[field]
        shardings[field] = (NamedSharding(mesh, tensor_parallel.spec((None, None, columns))),
                            NamedSharding(mesh, tensor_parallel.spec((None, rows, None))))
    return (shardings,) * num_layers


def init_slots(config: ModelConfig, max_loras: int, max_rank: int, dtype, mesh: Mesh | None = None) -> SlotArrays:
    """All-zero slots on the mesh (default_mesh() when None)."""
    mesh = mesh or tensor_parallel.default_mesh()
    shapes = slot_shapes(config, max_loras, max_rank, mesh.size)
    out_shardings = slot_shardings(mesh, config.num_layers)
    layer = lambda: {f: (jnp.zeros(a, dtype), jnp.zeros(b, dtype)) for f, (a, b) in shapes.items()}
    zeros = jax.jit(lambda: tuple(layer() for _ in range(config.num_layers)), out_shardings=out_shardings)
    return zeros()


def lay_out(adapter: HostAdapter, config: ModelConfig, tp_size: int) -> HostAdapter:
    """The adapter's b rows in the base weights' tensor-parallel order (unchanged at N = 1)."""
    rows = _laid_out_rows(config, tp_size)
    return {field: (a, b[:, rows[field]] if field in rows else b) for field, (a, b) in adapter.items()}


def _laid_out_rows(config: ModelConfig, tp_size: int) -> dict[str, np.ndarray]:
    """The fused fields' row indices in the tensor-parallel layout (none at N = 1)."""
    if tp_size == 1:
        return {}
    return {"w_qkv": tensor_parallel.qkv_rows(config, tp_size),
            "w_gate_up": tensor_parallel.gate_up_rows(config, tp_size)}


def _write(slots: SlotArrays, slot: jax.Array, adapter: HostAdapter) -> SlotArrays:
    """slots with slot `slot` (1-based, traced) holding `adapter` (its [L, PR, K] and [L, N, PR] arrays)."""
    index = slot - 1

    def write_layer(layer: int, layer_slots: LayerSlots) -> LayerSlots:
        return {field: (a.at[index].set(adapter[field][0][layer].astype(a.dtype)),
                        b.at[index].set(adapter[field][1][layer].astype(b.dtype)))
                for field, (a, b) in layer_slots.items()}

    return tuple(write_layer(layer, layer_slots) for layer, layer_slots in enumerate(slots))


def slot_writer(mesh: Mesh | None, num_layers: int):
    """The jitted write (slots donated: updated in place), keeping the slots' shardings (on default_mesh() when
    mesh is None)."""
    mesh = mesh or tensor_parallel.default_mesh()
    return jax.jit(_write, donate_argnums=(0,), out_shardings=slot_shardings(mesh, num_layers))


def abstract_adapter(slots: SlotArrays, sharding=None) -> HostAdapter:
    """The shapes of one adapter's arrays ([L, PR, K] and [L, N, PR] per field), for compiling the writer."""
    num_layers = len(slots)
    return {field: (jax.ShapeDtypeStruct((num_layers, *a.shape[1:]), a.dtype, sharding=sharding),
                    jax.ShapeDtypeStruct((num_layers, *b.shape[1:]), b.dtype, sharding=sharding))
            for field, (a, b) in slots[0].items()}
