"""The Llama forward over a 1-D device mesh (axis "tp"), Megatron-style under shard_map: the one forward path.

A model that is not split runs on a mesh of one device (default_mesh), through the same functions: at N = 1 the
layout is the ordinary one and XLA compiles the same program as without shard_map: no copy, and no collective (the
row-parallel outputs are already whole, so the reduce is the identity there: `_whole`).

Each of N devices holds Hq/N query heads and their KV heads (a KV head is replicated when N > Hkv, as in vLLM),
F/N MLP columns and V/N rows of the LM head; norms and the embedding table are replicated. A layer computes its
heads and MLP columns on each device and sums the partial outputs twice (after wo, after w_down): two
all-reduces per layer. The logits' vocabulary shards are gathered at the end.

Fused weights are laid out shard-major: device s's rows of w_qkv are [its q rows | its k rows | its v rows] and
of w_gate_up [its gate rows | its up rows], so an even split of the fused axis hands each device matching rows.
At N = 1 that is the ordinary layout. The KV pool holds max(Hkv, N) heads, split evenly over the devices.

Which mesh axis each parameter axis is split over is one table, PARAM_AXES (logical axis names) + AXIS_RULES.

Mixture of experts (model/moe.py): the router is replicated. Without expert parallelism every expert is split like
the dense MLP, on its intermediate axis (w_experts_gate_up shard-major per expert: device s holds its gate rows
then its up rows of each expert). With it (config.expert_parallel, EXPERT_PARALLEL_RULES) each device holds E/N
whole experts while attention, dense layers and Qwen2-MoE's shared expert stay split as above. Activations are
replicated at the MLP's input under this tensor parallelism, so each device runs its own experts on every token
(the router's global ids shifted by its first expert; the other devices' ids fall outside [0, E/N) and contribute
nothing) and the MLP's existing all-reduce sums the devices' partial outputs: an all-gather + psum scheme. An
all-to-all dispatch would move each token to its experts' devices, which pays only where tokens are sharded
(data-parallel attention); here every device already has every token, so the all-to-all would add two
collectives for nothing and the one psum is what the dense MLP already does.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxllm import progress
from jaxllm.config import ModelConfig
from jaxllm.model import weights
from jaxllm.model.kernels import REFERENCE, Kernels, select_kernels
from jaxllm.model.kv_cache import KVCache
from jaxllm.model.llama import compute_logits, device_forward_hidden
from jaxllm.model.params import LayerParams, LlamaParams
from jaxllm.model.step_batch import StepBatch

TP_AXIS = "tp"

# logical axis names of every parameter (a layer field's: those of one layer's array), and the mesh axis each maps to
PARAM_AXES = {
    "embed": ("vocab_replicated", "embed"), "final_norm": ("embed",), "lm_head": ("vocab", "embed"),
    "attn_norm": ("embed",), "mlp_norm": ("embed",),
    "w_qkv": ("heads", "embed"), "b_qkv": ("heads",), "wo": ("embed", "heads"),
    "w_gate_up": ("mlp", "embed"), "w_down": ("embed", "mlp"),
    "q_norm": ("head_dim",), "k_norm": ("head_dim",), "post_attn_norm": ("embed",), "post_mlp_norm": ("embed",),
    "router": ("experts_replicated", "embed"), "w_experts_gate_up": ("experts", "expert_mlp", "embed"),
    "w_experts_down": ("experts", "embed", "expert_mlp"), "w_shared_gate_up": ("mlp", "embed"),
    "w_shared_down": ("embed", "mlp"), "shared_gate": ("gate_out", "embed"),
}
KV_POOL_AXES = ("layers", "blocks", "kv_heads", "block_offset", "head_dim")  # [L, N, Hkv, B, D]
AXIS_RULES = {"heads": TP_AXIS, "kv_heads": TP_AXIS, "mlp": TP_AXIS, "vocab": TP_AXIS, "expert_mlp": TP_AXIS}
# --enable-expert-parallel: experts split whole, each expert's intermediate axis kept on its device
EXPERT_PARALLEL_RULES = {**{k: v for k, v in AXIS_RULES.items() if k != "expert_mlp"}, "experts": TP_AXIS}


def spec(logical_axes: tuple[str, ...], expert_parallel: bool = False) -> P:
    """The PartitionSpec of an array whose axes have these logical names."""
    rules = EXPERT_PARALLEL_RULES if expert_parallel else AXIS_RULES
    return P(*(rules.get(axis) for axis in logical_axes))


def check_tp_size(config: ModelConfig, tp_size: int, num_devices: int) -> None:
    """Raise ValueError naming the heads and the valid sizes when the model cannot be split over tp_size."""
    if not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tp_size!r}")
    if tp_size > num_devices:
        raise ValueError(f"tensor_parallel_size {tp_size} asks for more devices than the {num_devices} there are")
    # sizes that divide the query heads and the MLP width, and divide the KV heads or are a multiple of them (the
    # KV heads are then replicated)
    valid = [n for n in range(1, max(tp_size, num_devices) + 1)
             if config.num_heads % n == 0 and config.intermediate_size % n == 0
             and (config.num_kv_heads % n == 0 or n % config.num_kv_heads == 0) and _splits_experts(config, n)]
    if tp_size not in valid:
        raise ValueError(f"tensor_parallel_size {tp_size} does not split this model's {config.num_heads} query "
                         f"heads, {config.num_kv_heads} KV heads{_widths(config)} evenly; valid sizes: "
                         f"{', '.join(map(str, valid))}")


def _widths(config: ModelConfig) -> str:
    """The MLP widths a split must divide, for check_tp_size's message."""
    if not config.num_experts:
        return f" and MLP width {config.intermediate_size}"
    what = (f"{config.num_experts} experts (expert parallelism)" if config.expert_parallel else
            f"expert width {config.moe_intermediate_size}")
    return (f", MLP width {config.intermediate_size}, {what} and shared expert width "
            f"{config.shared_expert_intermediate_size}")


def _splits_experts(config: ModelConfig, n: int) -> bool:
    """Whether n devices split the experts evenly: whole (expert parallelism) or on their intermediate axis."""
    if config.shared_expert_intermediate_size % n:
        return False
    return (config.num_experts % n == 0) if config.expert_parallel else (config.moe_intermediate_size % n == 0)


def make_mesh(tp_size: int, devices=None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)[:tp_size]
    return Mesh(np.asarray(devices), (TP_AXIS,))


def default_mesh() -> Mesh:
    """The mesh of this process's first device: where a model that is not split runs."""
    return make_mesh(1, jax.local_devices())


def kv_heads_per_device(config: ModelConfig, tp_size: int) -> int:
    return max(config.num_kv_heads // tp_size, 1)


def local_config(config: ModelConfig, tp_size: int) -> ModelConfig:
    """The config one device's share of the model looks like (its heads and MLP columns)."""
    experts = dict(moe_intermediate_size=config.moe_intermediate_size // (1 if config.expert_parallel else tp_size),
                   shared_expert_intermediate_size=config.shared_expert_intermediate_size // tp_size)
    return dataclasses.replace(config, num_heads=config.num_heads // tp_size,
                               num_kv_heads=kv_heads_per_device(config, tp_size),
                               intermediate_size=config.intermediate_size // tp_size, **experts)


# ------------------------------------------------------------------------------------------ weight layout
def shard_major_params(params: LlamaParams, config: ModelConfig, tp_size: int) -> LlamaParams:
    """Ordinary-layout params -> the shard-major layout above (an explicit, vocab-padded lm_head when tied).

    The layout is a host-side row index per fused weight, applied with weights.take_rows: it lays out any weight
    format, numpy params on the host (the loaders' path) and device params alike. At N = 1 it is the ordinary
    layout: params are returned as they are (a tied head stays tied)."""
    if tp_size == 1:
        return params
    qkv = qkv_rows(config, tp_size)
    pairs = {"w_gate_up": (config.intermediate_size, 0),  # field -> (width of gate and of up, the row axis)
             "w_shared_gate_up": (config.shared_expert_intermediate_size, 0)}
    if not config.expert_parallel:  # each expert split on its intermediate axis (axis 1 of [E, 2I, H])
        pairs["w_experts_gate_up"] = (config.moe_intermediate_size, 1)

    def lay_out(layer: LayerParams) -> LayerParams:
        fused = {"w_qkv": weights.take_rows(layer.w_qkv, qkv, axis=0)}
        if layer.b_qkv is not None:
            fused["b_qkv"] = weights.take_rows(layer.b_qkv, qkv, axis=0)
        for name, (width, axis) in pairs.items():
            if getattr(layer, name) is not None:
                fused[name] = weights.take_rows(getattr(layer, name), pair_rows(width, tp_size), axis=axis)
        return layer.replace(**fused)

    params = params.map_layers(lay_out)
    lm_head = params.embed if params.lm_head is None else params.lm_head  # [V, H]
    xp = np if isinstance(lm_head, np.ndarray) else jnp
    lm_head = xp.pad(lm_head, ((0, -config.vocab_size % tp_size), (0, 0)))  # [V padded to a multiple of N, H]
    return params.replace(lm_head=lm_head)


def qkv_rows(config: ModelConfig, tp_size: int) -> np.ndarray:
    """[N * (Hq/N + 2*Hkv_local)*D] rows of the fused q|k|v axis, device by device: device s holds its query
    heads' rows, then its KV heads' k rows, then their v rows (a KV head shared by devices is repeated)."""
    d, hq, hkv = config.head_dim, config.num_heads, config.num_kv_heads
    q_per, kv_per = hq // tp_size, kv_heads_per_device(config, tp_size)
    k_start, v_start = hq * d, (hq + hkv) * d
    rows = []
    for s in range(tp_size):
        first_kv = (s * q_per) // (hq // hkv)  # the KV head of this device's first query head
        kv = np.arange(first_kv * d, (first_kv + kv_per) * d)
        rows += [np.arange(s * q_per * d, (s + 1) * q_per * d), k_start + kv, v_start + kv]
    return np.concatenate(rows)


def gate_up_rows(config: ModelConfig, tp_size: int) -> np.ndarray:
    """[2F] rows of the fused gate|up axis, device by device: device s holds its gate rows, then its up rows."""
    return pair_rows(config.intermediate_size, tp_size)


def pair_rows(f: int, tp_size: int) -> np.ndarray:
    """[2f] rows of a fused gate|up axis of width f each, device by device: its gate rows, then its up rows."""
    per = f // tp_size
    return np.concatenate([start + np.arange(s * per, (s + 1) * per) for s in range(tp_size) for start in (0, f)])


def param_shardings(params: LlamaParams, mesh: Mesh, expert_parallel: bool = False) -> LlamaParams:
    """A NamedSharding per parameter leaf, from PARAM_AXES and AXIS_RULES (EXPERT_PARALLEL_RULES with
    expert_parallel); a weight format's leaves each get theirs from its weights.leaf_axes."""
    def shardings(name: str, w):
        axes = weights.leaf_axes(w, PARAM_AXES[name])
        return jax.tree.map(lambda a: NamedSharding(mesh, spec(a, expert_parallel)), axes, is_leaf=weights.is_axes)

    def per_field(tree) -> dict:
        return {f.name: shardings(f.name, getattr(tree, f.name)) for f in dataclasses.fields(tree)
                if f.name != "layers" and getattr(tree, f.name) is not None}

    return LlamaParams(layers=tuple(LayerParams(**per_field(layer)) for layer in params.layers), **per_field(params))


def shard_params(params: LlamaParams, config: ModelConfig, mesh: Mesh,
                 on_placed: Callable[[str], None] | None = None) -> LlamaParams:
    """Params laid out shard-major and placed on the mesh, each device receiving only its own slice.

    The layout is computed on the host (device params are fetched first), so a device never holds more than its
    share: no whole-model copy, no relaid copy. Each array is built with jax.make_array_from_callback from its
    global shape: every process fills only its own devices, so this also places params over a mesh that spans
    processes. on_placed(path) runs after each array is placed (load-memory measurements sample there). On a
    mesh of one device each array is put there as it is (device params already there stay where they are)."""
    laid_out = params if mesh.size == 1 else shard_major_params(jax.device_get(params), config, mesh.size)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(laid_out)
    shardings = treedef.flatten_up_to(param_shardings(laid_out, mesh, config.expert_parallel))
    for (path, host), sharding in zip(leaves, shardings):
        check_even_split(jax.tree_util.keystr(path), host.shape, sharding.spec, mesh.size)
    placed = []
    steps = progress.track(zip(leaves, shardings), "Placing weights", "arrays", total=len(leaves),
                           nbytes=lambda item: item[0][1].nbytes)
    for (path, host), sharding in steps:
        placed.append(jax.device_put(host, sharding) if mesh.size == 1 else
                      jax.make_array_from_callback(host.shape, sharding, lambda index, host=host: host[index]))
        if on_placed is not None:
            on_placed(jax.tree_util.keystr(path))
    return treedef.unflatten(placed)


def check_even_split(name: str, shape: tuple[int, ...], partition: P, tp_size: int) -> None:
    """ValueError naming the parameter leaf when an axis split over the mesh does not divide evenly (a dense
    weight always does once check_tp_size passed; a packed int4 weight's groups may not)."""
    for size, axis in zip(shape, partition):
        if axis is not None and size % tp_size:
            raise ValueError(f"tensor_parallel_size {tp_size} cannot split {name} {tuple(shape)}: an axis of "
                             f"{size} does not divide into {tp_size} equal parts (a packed int4 weight's groups "
                             "of rows must not straddle two devices: choose another size, or quantize with a "
                             "smaller group size)")


def init_kv_cache(config: ModelConfig, num_blocks: int, block_size: int, dtype=jnp.float32,
                  mesh: Mesh | None = None) -> KVCache:
    """The zeroed KV pool [L, N, max(Hkv, tp), B, D] on the mesh (default_mesh() when None), its head axis split
    over the devices."""
    if num_blocks < 2:
        raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved for padding), got {num_blocks}")
    mesh = mesh or default_mesh()
    heads = kv_heads_per_device(config, mesh.size) * mesh.size
    shape = (config.num_layers, num_blocks, heads, block_size, config.head_dim)
    sharding = NamedSharding(mesh, spec(KV_POOL_AXES))
    zeros = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)
    return KVCache(k=zeros(), v=zeros())


# ------------------------------------------------------------------------------------------ the forward
def forward_hidden(params: LlamaParams, kv_cache: KVCache, batch: StepBatch, *, config: ModelConfig,
                   kernels: Kernels = REFERENCE, mesh: Mesh | None = None) -> tuple[jax.Array, KVCache]:
    """The forward over the mesh (default_mesh() when None): (final-normed hidden [R, H] at
    batch.logits_indices, replicated; kv_cache, split on its head axis, with this step's K/V written). Params as
    shard_params lays them out (any params on one device), the pool from init_kv_cache; the batch is replicated.
    The engine runs this as its forward program and computes logits in its sampler program."""
    mesh = mesh or default_mesh()
    param_specs = jax.tree.map(lambda s: s.spec, param_shardings(params, mesh, config.expert_parallel))
    kv_specs = KVCache(k=spec(KV_POOL_AXES), v=spec(KV_POOL_AXES))
    batch_specs = jax.tree.map(lambda _: P(), batch)
    per_device = local_config(config, mesh.size)

    # check_vma off: the attention loops carry per-device values from replicated initial ones; the hidden states
    # are all-reduced, so replicated as out_specs says
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(param_specs, kv_specs, batch_specs),
                       out_specs=(P(), kv_specs), check_vma=False)
    def step(local_params, local_kv, batch):
        first_expert = (jax.lax.axis_index(TP_AXIS) * (config.num_experts // mesh.size)
                        if config.expert_parallel else 0)  # the global id of this device's first expert
        return device_forward_hidden(local_params, local_kv, batch, config=per_device,
                                     kernels=layer_kernels(kernels, mesh),
                                     reduce=_all_reduce if mesh.size > 1 else _whole, first_expert=first_expert)

    return step(params, kv_cache, batch)


def forward(params: LlamaParams, kv_cache: KVCache, batch: StepBatch, *, config: ModelConfig,
            kernels: Kernels = REFERENCE, mesh: Mesh | None = None) -> tuple[jax.Array, KVCache]:
    """(logits [R, V] float32 at batch.logits_indices, kv_cache): forward_hidden and the LM head (its vocabulary
    shards, when split, joined by XLA)."""
    hidden, kv_cache = forward_hidden(params, kv_cache, batch, config=config, kernels=kernels, mesh=mesh)
    return compute_logits(params, hidden, config.vocab_size, config.final_logit_softcap,
                          lm_head_kernels(kernels, mesh or default_mesh())), kv_cache


def lm_head_kernels(kernels: Kernels, mesh: Mesh) -> Kernels:
    """The kernels of the LM head's dot: `kernels` when the head lies whole on one device; over several devices
    the head is split over the vocabulary and a native kernel (a custom call XLA cannot partition) would gather
    it whole, so XLA's own dot."""
    return kernels if mesh.size == 1 else REFERENCE


def layer_kernels(kernels: Kernels, mesh: Mesh) -> Kernels:
    """The kernels of the layers: `kernels` on one device; over several the residual adds take the reference (the
    fused add and norm takes a sublayer's float32 sums, whose all-reduce would carry twice the bytes of the
    outputs rounded first, as the reference and vLLM reduce them)."""
    return kernels if mesh.size == 1 else dataclasses.replace(kernels, add_rms_norm="reference")


def _whole(output: jax.Array) -> jax.Array:
    """The reduce of a mesh of one device: its output is already the whole sum. (XLA:CPU keeps a one-device psum
    as an all-reduce that copies its operand: 60 a step, 3.9 ms of a 512-token prefill forward, RESULTS.md.)"""
    return output


def _all_reduce(partial: jax.Array) -> jax.Array:
    """Sum a row-parallel projection's partial outputs over the devices (in float32, then back)."""
    return jax.lax.psum(partial.astype(jnp.float32), TP_AXIS).astype(partial.dtype)


def jit_forward(config: ModelConfig, kernels: Kernels | None = None, mesh: Mesh | None = None):
    """The jitted step forward(params, kv_cache, batch), the pool donated (updated in place on each device);
    kernels None: each operation's "auto" choice (select_kernels())."""
    kernels = select_kernels() if kernels is None else kernels
    return jax.jit(functools.partial(forward, config=config, kernels=kernels, mesh=mesh), donate_argnums=(1,))
