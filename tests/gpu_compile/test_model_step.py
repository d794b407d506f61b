"""The Llama-3-8B step compiled for an H200: the forward reads every weight where it lies, and the engine's
programs (forward, sampler, prompt logprobs, logit-state write) compile in bfloat16, with int4 AWQ weights, with LoRA slots and over
two devices. A Qwen3-30B-A3B-shaped mixture-of-experts step (its per-layer shapes, 4 layers) passes the same decode
checks with the Pallas MoE kernel, bfloat16 or int4 AWQ experts (the int4 grouped matmuls), at batch sizes from 1
token (8 of 128 experts routed) to 64 (every expert),
and the engine's forward programs at its shapes (decode-only T = 1, T = 512) write no weight either.

"Where it lies": no instruction of the compiled program writes a new array the shape of a weight (a weight sliced
out of a layer stack, copied or converted before its GEMM would; for a MoE layer also one expert's slice of its
[E, ...] stacks, which a gather of the routed experts would write), at batch 1 no temporary buffer is as large as
one weight, and the bytes the program's kernels move (deviceless.kernel_traffic, plus the K/V the attention reads)
stay within 1.15x of the weight bytes and the batch's K/V. The donated KV pool is aliased to the output, and
so is the donated logit state (penalty counts, flags and bias per slot) of the sampler and of its write program.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.benchmarks.model_presets import model_preset
from jaxllm.engine.bucketing import Buckets, ProgramKey
from jaxllm.engine.step_programs import StepPrograms
from jaxllm.lora import device_slots
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params
from jaxllm.model import select_kernels
from jaxllm.model import tensor_parallel as tp
from jaxllm.model.awq_weight import AWQWeight
from jaxllm.model.params import LINEAR_FIELDS
from tests.compiled_hlo import kernel_traffic, materialized

CONFIG = model_preset("llama3-8b")
MOE_CONFIG = dataclasses.replace(model_preset("qwen3-30b-a3b"), num_layers=4)  # every layer sparse
BLOCK = 16
CONTEXT = 1024
MAX_TRAFFIC_RATIO = 1.15


AWQ_FIELDS = LINEAR_FIELDS + ("w_experts_gate_up", "w_experts_down")  # a MoE layer's expert stacks int4 too


def abstract_params(weights: str = "bf16", config=CONFIG):
    """The model's params (the 8B by default) as abstract values: bfloat16, or with every linear (and a MoE
    layer's expert stacks) as int4 AWQ (group 128); the routers stay bfloat16."""
    params = jax.eval_shape(lambda: random_params(config, jax.random.key(0), jnp.bfloat16))
    if weights == "awq":
        def awq(w):
            *experts, n, k = w.shape  # [E, N, K] or [N, K]
            return AWQWeight(qweight=jax.ShapeDtypeStruct((*experts, k // 8, n), jnp.int32),
                             zeros=jax.ShapeDtypeStruct((*experts, k // 128, n), jnp.int8),
                             scales=jax.ShapeDtypeStruct((*experts, k // 128, n), jnp.bfloat16))
        params = params.map_layers(lambda layer: layer.replace(**{f: awq(getattr(layer, f)) for f in AWQ_FIELDS
                                                                  if getattr(layer, f) is not None}))
    return params


def placed(tree, sharding):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)


def decode_batch(batch_size: int):
    """A decode step: batch_size sequences of CONTEXT tokens (the newest one computed now), blocks numbered from 1."""
    per_seq = CONTEXT // BLOCK
    chunks = [SequenceChunk([7], CONTEXT - 1, list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)))
              for i in range(batch_size)]
    return jax.tree.map(jnp.asarray, build_step_batch(chunks, BLOCK))


def nbytes(tree) -> int:
    return sum(a.size * jnp.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def matrix_shapes(params) -> set[tuple[int, ...]]:
    """The shapes of every layer's weight matrices (and packed leaves), the arrays a copy would duplicate: with
    a MoE layer's expert stacks [E, N, K], each whole and one expert's [N, K]."""
    stacks = [tuple(a.shape) for a in jax.tree.leaves(params.layers) if len(a.shape) >= 2]
    return set(stacks) | {shape[1:] for shape in stacks if len(shape) == 3}


def smallest_weight(params) -> int:
    """Bytes of the smallest weight of a layer: a linear (all leaves of its format), or one expert's matrix."""
    def unit_bytes(weight) -> int:
        leaves = jax.tree.leaves(weight)
        experts = leaves[0].shape[0] if len(leaves[0].shape) == 3 else 1  # an [E, N, K] stack
        return nbytes(weight) // experts

    fields = [getattr(layer, f.name) for layer in params.layers for f in dataclasses.fields(layer)]
    return min(unit_bytes(w) for w in fields if w is not None and len(jax.tree.leaves(w)[0].shape) >= 2)


def compile_decode(h200, config, params, batch_size: int, kernels):
    """jit_forward of a decode step of batch_size sequences (decode_batch) over the one-device mesh, params and the
    KV pool abstract and replicated: (the compile report, the placed params, pool and batch)."""
    params = placed(params, h200.replicated())
    num_blocks = 1 + batch_size * CONTEXT // BLOCK + 64
    kv = placed(jax.eval_shape(lambda: init_kv_cache(config, num_blocks, BLOCK, jnp.bfloat16)), h200.replicated())
    batch = placed(decode_batch(batch_size), h200.replicated())
    forward = jit_forward(config, kernels, mesh=h200.mesh)  # the engine's one-device mesh
    return h200.compile(forward, params, kv, batch, ptxas_reports=False), params, kv, batch


def assert_reads_weights_where_they_lie(report, config, params, kv, batch):
    """No weight-shaped array written, at batch 1 no temporary as large as one weight (larger batches' temporaries
    are activations that grow with the batch: at 64 tokens the MoE step's are the experts' [T*k padded, I] hidden
    rows and split-K partial sums, ~10 MB), the donated pool aliased, and the kernels' traffic within
    MAX_TRAFFIC_RATIO of the weights plus the batch's K/V. kernel_traffic counts each kernel's operands whole, so
    an expert stack counts whole too: the bound is on copies, not on routing."""
    tokens = len(batch.token_ids)
    assert materialized(report.hlo, matrix_shapes(params)) == []
    if tokens == 1:
        assert report.memory.temp_size_in_bytes < smallest_weight(params), (report.memory.temp_size_in_bytes,
                                                                             smallest_weight(params))
    assert report.memory.alias_size_in_bytes == nbytes(kv)  # the donated pool is updated in place

    layer_bytes = nbytes(params.layers) + nbytes(params.final_norm)
    kv_read = tokens * 2 * config.num_layers * CONTEXT * config.num_kv_heads * config.head_dim * 2  # K, V bf16
    embed_rows = tokens * config.hidden_size * 2
    moved = kernel_traffic(report.hlo, {tuple(kv.k.shape), tuple(params.embed.shape)}) + kv_read + embed_rows
    ratio = moved / (layer_bytes + kv_read)
    assert ratio <= MAX_TRAFFIC_RATIO, f"{moved / 1e9:.2f} GB moved for {(layer_bytes + kv_read) / 1e9:.2f} GB"


@pytest.mark.parametrize("weights", ["bf16", "awq"])
def test_8b_batch1_decode_reads_each_weight_where_it_lies(h200, weights):
    report, params, kv, batch = compile_decode(h200, CONFIG, abstract_params(weights), 1, select_kernels("pallas"))
    assert_reads_weights_where_they_lie(report, CONFIG, params, kv, batch)
    if weights == "awq":  # one dequant-matmul per linear per layer: the int4 weights are read by the kernel
        assert len(report.kernels_named("awq_matmul")) == len(LINEAR_FIELDS) * CONFIG.num_layers


def dense_stack_shapes(params) -> set[tuple[int, ...]]:
    """The dense shapes int4 expert stacks stand for, whole and per expert, in both orientations: what a
    dequantized copy outside the kernels would write."""
    stacks = [w.shape for layer in params.layers for w in (layer.w_experts_gate_up, layer.w_experts_down)
              if isinstance(w, AWQWeight)]
    return {s for e, n, k in stacks for s in ((e, n, k), (e, k, n), (n, k), (k, n))}


@pytest.mark.parametrize("weights", ["bf16", "awq"])
@pytest.mark.parametrize("batch_size", [1, 8, 64])
def test_moe_decode_reads_each_expert_where_it_lies(h200, batch_size, weights):
    """With int4 weights the experts run in the int4 grouped matmuls (one of each per layer: what shows the int4
    path runs), and no unfused dequantized expert or stack is written. The second check alone cannot tell the
    paths apart: moe "reference" dequantizes every expert in jnp, and XLA fuses that into its GEMM (no array
    written either); it guards against a dequantized copy outside the kernels."""
    kernels = select_kernels()  # "auto" on a GPU: the Pallas attention and MoE kernels
    assert kernels.moe == "pallas"
    report, params, kv, batch = compile_decode(h200, MOE_CONFIG, abstract_params(weights, MOE_CONFIG), batch_size,
                                               kernels)
    assert_reads_weights_where_they_lie(report, MOE_CONFIG, params, kv, batch)
    assert materialized(report.hlo, dense_stack_shapes(params)) == []
    suffix = "_int4" if weights == "awq" else ""
    for prefix in (f"moe_gate_up{suffix}", f"moe_down{suffix}", "split_kv_paged_attention"):  # once per layer
        assert len(report.kernels_named(prefix)) == MOE_CONFIG.num_layers, (prefix, [k.name for k in report.kernels])


def engine_programs(h200, *, lora: bool = False, weights: str = "bf16", config=CONFIG):
    """The engine's StepPrograms over the compile-only mesh, with the params (the 8B by default) and pool split
    over it as the runner places them (abstract), and the LoRA slots (4 adapters of rank 16) when asked for."""
    mesh = h200.mesh
    params = abstract_params(weights, config)
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params,
                          tp.param_shardings(params, mesh))
    kv = jax.eval_shape(lambda: tp.init_kv_cache(config, 2048, BLOCK, jnp.bfloat16, mesh=mesh))
    slots = None
    if lora:
        slots = jax.eval_shape(lambda: device_slots.init_slots(config, 4, 16, jnp.bfloat16, mesh))
    buckets = Buckets(max_num_batched_tokens=512, max_num_seqs=256, decode_only_programs=True)
    programs = StepPrograms(config, select_kernels("pallas"), buckets, max_blocks_per_seq=512, mesh=mesh,
                            lora_slots=slots)
    return programs, params, kv


def compile_program(h200, programs, key: ProgramKey, params, kv):
    program = programs.program(key)
    return h200.compile(program.jitted, *programs.example_args(key, params, kv), ptxas_reports=False,
                        **program.static)


@pytest.mark.parametrize("key", [ProgramKey("forward", 1, decode_only=True), ProgramKey("forward", 512),
                                 ProgramKey("sample", 256), ProgramKey("prompt_logprobs"),
                                 ProgramKey("write_logit_rows")], ids=str)
def test_engine_programs_compile_at_8b(h200, key):
    programs, params, kv = engine_programs(h200)
    report = compile_program(h200, programs, key, params, kv)
    if key.kind == "forward":
        assert materialized(report.hlo, matrix_shapes(params)) == []
        kernel = "split_kv_paged_attention" if key.decode_only else "ragged_paged_attention"
        assert len(report.kernels_named(kernel)) == CONFIG.num_layers
    if key.kind in ("sample", "write_logit_rows"):  # the donated logit state is updated in place
        assert report.memory.alias_size_in_bytes == nbytes(programs.abstract_logit_state())


@pytest.mark.parametrize("key", [ProgramKey("forward", 1, decode_only=True), ProgramKey("forward", 512)], ids=str)
def test_engine_forward_compiles_at_moe_shapes(h200, key):
    programs, params, kv = engine_programs(h200, config=MOE_CONFIG)
    report = compile_program(h200, programs, key, params, kv)
    assert materialized(report.hlo, matrix_shapes(params)) == []
    for prefix in ("moe_gate_up", "moe_down"):
        assert len(report.kernels_named(prefix)) == MOE_CONFIG.num_layers, prefix


@pytest.mark.parametrize("weights", ["bf16", "awq"])
def test_engine_forward_with_lora_slots_compiles_at_8b(h200, weights):
    programs, params, kv = engine_programs(h200, lora=True, weights=weights)
    report = compile_program(h200, programs, ProgramKey("forward", 1, decode_only=True), params, kv)
    slot_shapes = {tuple(a.shape) for a in jax.tree.leaves(programs.lora_slots)}
    assert materialized(report.hlo, matrix_shapes(params) | slot_shapes) == []
    per_step = len(LINEAR_FIELDS) * CONFIG.num_layers  # a shrink and an expand per linear per layer
    assert (len(report.kernels_named("lora_shrink")), len(report.kernels_named("lora_expand"))) == (per_step,
                                                                                                    per_step)


def test_tensor_parallel_forward_compiles_over_two_devices(h200x2):
    programs, params, kv = engine_programs(h200x2)
    report = compile_program(h200x2, programs, ProgramKey("forward", 1, decode_only=True), params, kv)
    assert report.hlo.count(" all-reduce-start(") + report.hlo.count(" all-reduce(") == 2 * CONFIG.num_layers
    local_shapes = {tuple(a.sharding.shard_shape(a.shape)) for a in jax.tree.leaves(params.layers)
                    if len(a.shape) == 2}  # what one device holds
    assert materialized(report.hlo, local_shapes) == []
    np.testing.assert_equal(len(report.kernels_named("split_kv_paged_attention")), CONFIG.num_layers)
