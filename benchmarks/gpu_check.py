"""GPU check of the Pallas kernels (paged attention, int4 AWQ, multi-LoRA): correctness vs the references, timings.

    python benchmarks/gpu_check.py                # one H200: at most ~8 minutes (--budget-s 460 + start-up)
    python benchmarks/gpu_check.py --cpu-smoke    # the same code path with tiny shapes, interpret mode, on a CPU

Run from the repository root (the repository is put on sys.path; nothing needs installing). Sections run one after
the other, each in its own try block, so a failing section is reported and the rest still run:

    correctness   each kernel vs the reference (f32 reference at highest matmul precision), Llama-3-8B shapes
                  among others; unused pool slots hold NaN, so a kernel that reads a masked lane fails
    kernels       median time per call of the reference (XLA), the ragged kernel and the split-KV kernel on
                  decode and prefill steps, decode bandwidth against the H200's 4.8 TB/s, and the time of the XLA
                  scatter that writes the step's K/V (it stays outside the kernels)
    end_to_end    decode step time of a random-weight Llama-3-8B-shaped model in bf16 at batch 1, 64 and 256
                  through jit_forward, pallas vs reference attention
    engine        the whole engine on a random-weight SmolLM2-shaped model in bf16, Pallas attention: warm-up
                  (programs, seconds), then a mixed workload with async scheduling on and off: output tokens/s
                  and the programs it compiled after warm-up (must be 0); a third row on the tensor-parallel
                  code path at N = 1; a fourth with the weights RTN int4 AWQ (the dequant-matmul kernel in
                  every linear)
    awq           int4 AWQ dequant-matmul kernels vs a bf16 dot vs XLA dequantize + dot at Llama-3-8B shapes,
                  M = 1, 16, 64, 256: microseconds, fraction of the HBM roofline, error vs the reference
    lora          multi-LoRA delta kernel (shrink + expand) vs the XLA reference vs the base bf16 dense dot of the
                  same (K, N) at Llama-3-8B shapes (q|k|v R 48, gate|up R 32, down R 16, o R 16), T = 1, 16, 64,
                  256 tokens on 1 or 4 distinct adapters: error vs the reference, microseconds, x_dense (time as
                  a multiple of the dense dot's: the LoRA overhead); then a few knob settings at T = 1 and 256
    tuning        kernel time for a few settings of the tiling knobs, to pick the defaults from measurements

Each section starts no new measurement once its share of --budget-s is spent (its window's end is fixed in seconds
of the default budget, scaled to --budget-s).

Results go to $OUT/gpu_check.json (default ./gpu_check_out); a summary table is printed last.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxllm.benchmarks.model_presets import model_preset  # noqa: E402
from jaxllm.compile_counter import CompileCounter  # noqa: E402
from jaxllm.config import ModelConfig  # noqa: E402
from jaxllm.engine.args import EngineArgs  # noqa: E402
from jaxllm.engine.engine import LLMEngine  # noqa: E402
from jaxllm.loaders import LoadedModel  # noqa: E402
from jaxllm.sampling_params import SamplingParams  # noqa: E402
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params  # noqa: E402
from jaxllm.model.kv_cache import write_kv  # noqa: E402
from pallas_kernels.paged_attention import (ragged_paged_attention, ragged_paged_attention_reference,  # noqa: E402
                                            split_kv_paged_attention)
from pallas_kernels.paged_attention.testing import (poison_unused_slots, random_ragged_case,  # noqa: E402
                                                    reference_output, relative_error)

PEAK_HBM_BYTES_S = 4.8e12  # H200
DEFAULT_BUDGET_S = 460.0  # --budget-s: seconds after which no section starts a new measurement
BLOCK_SIZE = 16
LLAMA3_8B_ATTN = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=BLOCK_SIZE)
SMOLLM2_ATTN = dict(num_q_heads=9, num_kv_heads=3, head_dim=64)
GPU_TOLERANCE = {"float32": 1e-2, "bfloat16": 3e-2}  # f32 dots run as TF32 inside the kernels
LLAMA3_8B = ModelConfig(architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                        num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0)
TINY = ModelConfig(architecture="llama", vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16)


@dataclasses.dataclass(frozen=True)
class Profile:
    attn: dict  # attention layout of the kernel benchmarks
    correctness: tuple  # (name, kernels, [(q_len, context)], layout overrides)
    decode: tuple  # (batch, context) per decode benchmark
    prefill: tuple  # (name, [(q_len, context)]) per prefill / mixed benchmark
    model: ModelConfig
    e2e_batches: tuple
    e2e_context: int
    tuning: tuple  # (kernel, name, [(q_len, context)], [knob overrides]) per knob sweep
    engine: dict  # EngineArgs of the engine section (its model: engine_model), and its workload size
    engine_model: ModelConfig
    engine_requests: int
    iters: int  # calls per timing loop
    repeats: int  # timing loops; the median is reported


GPU = Profile(
    attn=LLAMA3_8B_ATTN,
    correctness=(
        ("llama3_8b_mixed", ("ragged",), [(1, 1000), (1, 17), (128, 128), (37, 300), (1, 4000)], {}),
        ("llama3_8b_decode", ("ragged", "split_kv"), [(1, c) for c in (1, 16, 17, 333, 1000, 4096)], {}),
        ("llama3_8b_long_prefill", ("ragged",), [(1024, 2048), (300, 300)], {}),
        ("smollm2_mixed", ("ragged",), [(1, 500), (64, 64), (9, 90)], SMOLLM2_ATTN),
        ("smollm2_decode", ("split_kv",), [(1, 500), (1, 3), (1, 2049)], SMOLLM2_ATTN),
        ("mha_block32", ("ragged", "split_kv"), [(1, 700), (1, 33)], dict(num_q_heads=8, num_kv_heads=8,
                                                                           block_size=32)),
    ),
    decode=((1, 1024), (1, 8192), (64, 1024), (64, 4096), (256, 1024), (256, 2048)),
    prefill=(
        ("4x512 prompts", [(512, 512)] * 4),
        ("chunk 512 @2048 + 63 decode @1024", [(512, 2048)] + [(1, 1024)] * 63),
        ("2048 prompt", [(2048, 2048)]),
    ),
    model=LLAMA3_8B,
    e2e_batches=(1, 64, 256),
    e2e_context=1024,
    tuning=(
        ("split_kv", "decode b8 ctx8192", [(1, 8192)] * 8,
         [dict(block_kv=32), {}, dict(block_kv=128), dict(num_warps=8), dict(block_kv=128, num_warps=8),
          dict(num_stages=3), dict(num_splits=16), dict(num_splits=64)]),
        ("ragged", "decode b64 ctx4096", [(1, 4096)] * 64,
         [dict(block_kv=32), {}, dict(block_kv=128), dict(num_warps=8), dict(num_stages=3)]),
        ("ragged", "prefill 2048", [(2048, 2048)],
         [{}, dict(block_kv=32), dict(block_kv=128), dict(block_q=32), dict(block_q=32, num_warps=8),
          dict(block_q=32, block_kv=32, num_warps=8), dict(num_stages=3)]),
    ),
    engine=dict(max_model_len=2048, max_num_seqs=64, max_num_batched_tokens=512),
    engine_model=model_preset("smollm2-135m"),
    engine_requests=128,
    iters=20,
    repeats=5,
)

SMOKE = Profile(
    attn=dict(num_q_heads=8, num_kv_heads=2, head_dim=64, block_size=BLOCK_SIZE),
    correctness=(("tiny_mixed", ("ragged",), [(1, 40), (9, 20)], {}),
                 ("tiny_decode", ("split_kv",), [(1, 40), (1, 3)], {})),
    decode=((2, 64),),
    prefill=(("prompt 32", [(32, 32)]),),
    model=TINY,
    e2e_batches=(2,),
    e2e_context=24,
    tuning=(("split_kv", "decode b2 ctx64", [(1, 64)] * 2, [dict(block_kv=16, num_splits=2)]),),
    engine=dict(max_model_len=64, max_num_seqs=2, max_num_batched_tokens=16),
    engine_model=TINY,
    engine_requests=3,
    iters=1,
    repeats=1,
)


# ---------------------------------------------------------------------------------------------------- helpers


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def kernel_fn(name: str, max_query_len: int, sm_scale: float, interpret: bool):
    """Attention function (q, k_pool, v_pool, layer, tables, context_lens, query_start_loc) -> [T, Hq, D]."""
    kernels = {"reference": ragged_paged_attention_reference, "ragged": ragged_paged_attention,
               "split_kv": split_kv_paged_attention}
    extra = {} if name == "reference" else dict(interpret=interpret, max_query_len=max_query_len)
    return functools.partial(kernels[name], sm_scale=sm_scale, **extra)


def median_call_seconds(fn, args, profile: Profile) -> float:
    """Median over `repeats` timing loops of `iters` back-to-back calls run inside one jitted loop, per call.

    fn maps args -> an array shaped like args[0]; each call feeds its output into the next one, so nothing is hoisted
    and there is no per-call dispatch overhead in the figure.
    """
    loop = jax.jit(lambda first, *rest: jax.lax.fori_loop(0, profile.iters, lambda _, x: fn(x, *rest), first))
    jax.block_until_ready(loop(*args))  # compile and warm up
    times = []
    for _ in range(profile.repeats):
        start = time.perf_counter()
        jax.block_until_ready(loop(*args))
        times.append((time.perf_counter() - start) / profile.iters)
    return statistics.median(times)


def measured(row: dict, measure) -> dict:
    """`row` updated with the dict measure() returns, or with the error it raised: one failure hides nothing else."""
    try:
        row.update(measure())
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        log(f"  FAILED {row}\n{traceback.format_exc()}")
    else:
        log("  " + "  ".join(f"{k}={_fmt(v)}" for k, v in row.items()))
    return row


def out_of_time(deadline: float, section: str) -> bool:
    if time.time() < deadline:
        return False
    log(f"  {section}: out of its time budget, skipping the rest")
    return True


def uniform_case(profile: Profile, seqs, dtype=jnp.bfloat16, **layout):
    return random_ragged_case(0, seqs, dtype=dtype, num_layers=1, device_rng=True, **dict(profile.attn, **layout))


# ---------------------------------------------------------------------------------------------------- sections


def section_environment(interpret: bool) -> list[dict]:
    device = jax.devices()[0]
    return [{"jax": jax.__version__, "backend": jax.default_backend(), "device": device.device_kind,
             "num_devices": jax.device_count(), "python": sys.version.split()[0], "interpret": interpret}]


def section_correctness(profile: Profile, interpret: bool, deadline: float) -> list[dict]:
    """Each kernel on a NaN-poisoned pool vs the reference on the clean one; padding tokens must come out 0."""
    rows = []
    for name, kernels, seqs, layout in profile.correctness:
        for dtype in (jnp.float32, jnp.bfloat16):
            if out_of_time(deadline, "correctness"):
                return rows
            case = random_ragged_case(len(rows), seqs, dtype=dtype, pad_seqs=2, pad_tokens=3,
                                      **dict(profile.attn, **layout))
            sm_scale = case.q.shape[-1] ** -0.5
            with jax.default_matmul_precision("highest"):
                expected = reference_output(case, sm_scale)
            poisoned = poison_unused_slots(case, float("nan"))
            tol = GPU_TOLERANCE[jnp.dtype(dtype).name]
            for kernel in kernels:
                row = {"case": name, "kernel": kernel, "dtype": jnp.dtype(dtype).name, "tol": tol, "ok": False}
                attend = jax.jit(kernel_fn(kernel, case.max_query_len, sm_scale, interpret))
                rows.append(measured(row, functools.partial(compare, attend, poisoned, expected, tol)))
    return rows


def compare(attend, case, expected: np.ndarray, tol: float) -> dict:
    """attend(*case.args()) vs expected on the valid tokens; the padding tokens' rows must be zeros."""
    out = np.asarray(attend(*case.args()), np.float32)
    valid = case.num_valid_tokens
    err = relative_error(out[:valid], expected[:valid])
    return {"rel_err": err, "ok": bool(err < tol and np.all(out[valid:] == 0))}


def section_kernels(profile: Profile, interpret: bool, deadline: float) -> list[dict]:
    """Decode: reference vs both kernels, bandwidth; prefill/mixed: reference vs the ragged kernel; K/V write."""
    rows = []
    for batch, context in profile.decode:
        if out_of_time(deadline, "kernels"):
            return rows
        case = uniform_case(profile, [(1, context)] * batch)
        _, _, num_kv_heads, _, head_dim = case.k_pool.shape
        moved = (2 * batch * context * num_kv_heads * head_dim + 2 * case.q.size) * case.q.dtype.itemsize
        for impl in ("reference", "ragged", "split_kv"):
            row = {"kind": "decode", "case": f"b{batch} ctx{context}", "impl": impl}
            rows.append(measured(row, functools.partial(call_time, kernel_fn(impl, 1, 0.1, interpret), case, profile,
                                                        bytes_moved=moved)))
        rows.append(measured({"kind": "kv_write", "case": f"b{batch} ctx{context}", "impl": "xla_scatter"},
                             functools.partial(kv_write_time, case, profile)))
    for name, seqs in profile.prefill:
        if out_of_time(deadline, "kernels"):
            return rows
        case = uniform_case(profile, seqs)
        flops = sum(4 * case.q.shape[1] * case.q.shape[2] * sum(range(c - q + 1, c + 1)) for q, c in seqs)
        for impl in ("reference", "ragged"):
            rows.append(measured({"kind": "prefill", "case": name, "impl": impl}, functools.partial(
                call_time, kernel_fn(impl, case.max_query_len, 0.1, interpret), case, profile, flops=flops)))
        rows.append(measured({"kind": "kv_write", "case": name, "impl": "xla_scatter"},
                             functools.partial(kv_write_time, case, profile)))
    return rows


def call_time(attend, case, profile: Profile, *, bytes_moved: int = 0, flops: int = 0) -> dict:
    """Median time of attend(*case.args()) and the bandwidth or compute rate it implies."""
    sec = median_call_seconds(attend, case.args(), profile)
    row = {"ms": sec * 1e3}
    if bytes_moved:
        row.update({"GB/s": bytes_moved / sec / 1e9, "%peak_hbm": 100 * bytes_moved / sec / PEAK_HBM_BYTES_S})
    if flops:
        row["TFLOP/s"] = flops / sec / 1e12
    return row


def kv_write_time(case, profile: Profile) -> dict:
    """Time of the XLA scatter that writes one layer's K/V for the case's tokens (in place: the pools are donated)."""
    num_tokens, _, head_dim = case.q.shape
    num_kv_heads = case.k_pool.shape[2]
    slots = jnp.arange(num_tokens, dtype=jnp.int32) + BLOCK_SIZE  # past the null block
    new = jnp.ones((num_tokens, num_kv_heads, head_dim), case.k_pool.dtype)
    write = lambda pools: write_kv(*pools, 0, slots, new, new)
    loop = jax.jit(lambda pools: jax.lax.fori_loop(0, profile.iters, lambda _, p: write(p), pools), donate_argnums=0)
    pools = jax.block_until_ready(loop((jnp.copy(case.k_pool), jnp.copy(case.v_pool))))
    times = []
    for _ in range(profile.repeats):
        start = time.perf_counter()
        pools = jax.block_until_ready(loop(pools))
        times.append((time.perf_counter() - start) / profile.iters)
    return {"ms": statistics.median(times) * 1e3}


def section_end_to_end(profile: Profile, interpret: bool, deadline: float) -> list[dict]:
    """Decode steps of the random-weight model through jit_forward, pallas vs reference attention, per batch size."""
    del interpret  # the attention backend picks interpret mode itself off a GPU
    config, context = profile.model, profile.e2e_context
    start = time.perf_counter()
    params = jax.block_until_ready(jax.jit(random_params, static_argnums=(0, 2))(config, jax.random.key(0),
                                                                                 jnp.bfloat16))
    log(f"  random {config.num_layers}-layer bf16 params in {time.perf_counter() - start:.1f} s")
    blocks_per_seq = -(-context // BLOCK_SIZE)
    rows = []
    for batch in profile.e2e_batches:
        chunks = [SequenceChunk([7], context - 1, list(range(1 + i * blocks_per_seq, 1 + (i + 1) * blocks_per_seq)))
                  for i in range(batch)]
        step = jax.device_put(build_step_batch(chunks, BLOCK_SIZE))
        for attention in ("pallas", "reference"):
            if out_of_time(deadline, "end_to_end"):
                return rows
            row = {"batch": batch, "context": context, "attention": attention}
            rows.append(measured(row, functools.partial(decode_steps, config, attention, params, step,
                                                        1 + batch * blocks_per_seq, profile)))
    return rows


def decode_steps(config: ModelConfig, attention: str, params, step, num_blocks: int, profile: Profile) -> dict:
    """Median decode step time; each step writes its K/V into a donated cache of num_blocks blocks."""
    forward = jit_forward(config, attention=attention)
    cache = init_kv_cache(config, num_blocks, BLOCK_SIZE, jnp.bfloat16)
    start = time.perf_counter()
    logits, cache = forward(params, cache, step)
    logits.block_until_ready()
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(max(profile.iters // 2, 1) * profile.repeats):
        start = time.perf_counter()
        logits, cache = forward(params, cache, step)
        logits.block_until_ready()
        times.append(time.perf_counter() - start)
    sec = statistics.median(times)
    return {"step_ms": sec * 1e3, "tokens_per_s": len(step.context_lens) / sec, "compile_s": compile_s}


AWQ_ENGINE_GROUP = 64  # SmolLM2's hidden size 576 has no group of 128


def section_engine(profile: Profile, interpret: bool, deadline: float) -> list[dict]:
    """LLMEngine with Pallas attention: warm-up of the whole program set, then a mixed workload compiling nothing;
    with async scheduling on and off, and through the tensor-parallel code path at N = 1 (shard_map, the split
    pool and LM head, on one device)."""
    config = dataclasses.replace(profile.engine_model, max_position_embeddings=profile.engine["max_model_len"])
    params = jax.block_until_ready(jax.jit(random_params, static_argnums=(0, 2))(config, jax.random.key(0),
                                                                                 jnp.bfloat16))
    cache = tempfile.mkdtemp(prefix="gpu-check-xla-cache-")  # the second engine loads what the first compiled
    rows = []
    for weights, async_scheduling, tp_size in (("bf16", True, None), ("bf16", False, None), ("bf16", True, 1),
                                               ("awq", True, None)):
        if out_of_time(deadline, "engine"):
            return rows
        if weights == "awq":  # the same weights RTN int4 (group 64), kept packed: the AWQ kernel inside every step
            from jaxllm.quantization.rtn_params import rtn_awq_params
            params = jax.device_put(rtn_awq_params(params, AWQ_ENGINE_GROUP))
        row = {"weights": weights, "async_scheduling": async_scheduling, "tensor_parallel_size": tp_size}
        rows.append(measured(row, functools.partial(engine_run, profile, config, params, async_scheduling, tp_size,
                                                    cache)))
    return rows


def engine_run(profile: Profile, config: ModelConfig, params, async_scheduling: bool, tp_size: int | None,
               cache: str) -> dict:
    start = time.perf_counter()
    engine = LLMEngine(EngineArgs(skip_tokenizer=True, attention="pallas", warmup=True, compilation_cache_dir=cache,
                                  async_scheduling=async_scheduling, tensor_parallel_size=tp_size, **profile.engine),
                       loaded=LoadedModel(config, params, source=None))
    warmup_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    limit = profile.engine["max_model_len"]
    for i in range(profile.engine_requests):
        prompt = rng.integers(3, config.vocab_size, size=int(rng.integers(1, limit // 4))).tolist()
        params_i = SamplingParams(temperature=float(i % 2), top_p=0.9, max_tokens=int(rng.integers(1, limit // 4)),
                                  ignore_eos=True, detokenize=False)
        engine.add_request(str(i), prompt, params_i)
    tokens, start = 0, time.perf_counter()
    with CompileCounter() as compiles:
        while engine.has_unfinished_requests():
            tokens += sum(len(c.token_ids) for out in engine.step() if out.finished for c in out.outputs)
    seconds = time.perf_counter() - start
    return {"programs": engine.runner.num_compiled_programs, "warmup_s": warmup_s,
            "compile_s": engine.runner.programs.compile_seconds, "output_tok_s": tokens / seconds,
            "steps": engine.num_steps, "compiles_after_warmup": compiles.count, "ok": compiles.count == 0}


def section_awq(profile: Profile, interpret: bool, deadline: float) -> list[dict]:
    """Int4 AWQ matmul (pallas_kernels/awq_matmul, group size 128) at Llama-3-8B MLP shapes, per M: the fused kernel
    (its error against the float32 reference checked first), a bf16 dense dot and XLA dequantize + dot; then the
    kernel under a few knob settings at M = 1 and 256. %hbm: an implementation's least bytes (its weight format,
    scales and zeros, bf16 x, float32 y) per second against the H200's 4.8 TB/s."""
    from pallas_kernels.awq_matmul import awq_matmul, awq_matmul_reference, dequantize
    from pallas_kernels.awq_matmul.testing import TOLERANCE, device_random_packed, random_activations, relative_error

    group, tol = 128, TOLERANCE[jnp.dtype(jnp.bfloat16)]
    shapes = ((256, 40),) if interpret else ((4096, 14336), (14336, 4096))  # (K, N)
    batch_sizes = (1, 20) if interpret else (1, 16, 64, 256)
    sweeps = ((1, [dict(block_n=32)]), (20, [dict(block_m=16)])) if interpret else (
        (1, [{}, dict(block_n=64), dict(block_n=256), dict(block_k=128), dict(block_k=512), dict(split_k=1),
             dict(split_k=8), dict(num_warps=8), dict(num_stages=3)]),
        (256, [{}, dict(block_m=32), dict(block_m=128), dict(block_n=64), dict(block_n=256), dict(block_k=256),
               dict(num_warps=8), dict(block_m=128, num_warps=8), dict(num_stages=2), dict(num_stages=4)]))
    impls = {
        "bf16_dense": lambda x, w: jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())),
                                                       preferred_element_type=jnp.float32),  # w [N, K]
        "awq_kernel": functools.partial(awq_matmul, interpret=interpret),
        "xla_dequant_dot": lambda x, p: jnp.dot(x, dequantize(p, x.dtype), preferred_element_type=jnp.float32),
    }

    def timed(matmul, x, w, moved: int) -> dict:
        def chained(x, w):  # x-shaped and dependent on the whole product, which the barrier keeps whole
            y = jax.lax.optimization_barrier(matmul(x, w))  # [M, N]
            return x + (y[0, 0] * 0).astype(x.dtype)
        sec = median_call_seconds(chained, (x, w), profile)
        flops = 2 * x.shape[0] * x.shape[1] * w.n if hasattr(w, "n") else 2 * x.size * w.shape[0]
        return {"us": sec * 1e6, "%hbm": 100 * moved / sec / PEAK_HBM_BYTES_S, "TFLOP/s": flops / sec / 1e12}

    def checked(x, packed) -> dict:
        with jax.default_matmul_precision("highest"):
            expected = np.asarray(jax.jit(awq_matmul_reference)(x, packed))
        out = np.asarray(jax.jit(impls["awq_kernel"])(x, packed))
        err = relative_error(out, expected)
        return {"rel_err": err, "max_abs_err": float(np.abs(out - expected).max()), "ok": bool(err < tol)}

    def checked_then_timed(matmul, x, packed, moved: int) -> dict:
        return {**checked(x, packed), **timed(matmul, x, packed, moved)}

    rows = []
    for k, n in shapes:
        packed = device_random_packed(0, k, n, group)
        dense = jax.block_until_ready(jax.jit(lambda p: dequantize(p, jnp.bfloat16).T)(packed))  # [N, K]
        int4_bytes = k * n // 2 + 3 * (k // group) * n  # packed weights, fp16 scales, int8 zeros
        for m in batch_sizes:
            x = random_activations(m, m, k, jnp.bfloat16)  # [M, K]
            io_bytes = 2 * m * k + 4 * m * n
            for impl, matmul in impls.items():
                if out_of_time(deadline, "awq"):
                    return rows
                w, moved = (dense, 2 * k * n + io_bytes) if impl == "bf16_dense" else (packed, int4_bytes + io_bytes)
                row = {"kind": "matmul", "shape": f"K{k} N{n}", "M": m, "impl": impl}
                measure = functools.partial(checked_then_timed if impl == "awq_kernel" else timed, matmul, x, w, moved)
                rows.append(measured(row, measure))
        for m, knob_sets in sweeps:
            x = random_activations(m, m, k, jnp.bfloat16)
            for knobs in knob_sets:
                if out_of_time(deadline, "awq"):
                    return rows
                row = {"kind": "tuning", "shape": f"K{k} N{n}", "M": m, "knobs": knobs or "defaults"}
                matmul = functools.partial(awq_matmul, interpret=interpret, **knobs)
                rows.append(measured(row, functools.partial(timed, matmul, x, packed,
                                                            int4_bytes + 2 * m * k + 4 * m * n)))
    return rows


LORA_SLOTS = 4  # adapter slots held on the device in the lora section; 1 or 4 of them used by a step's tokens


def section_lora(profile: Profile, interpret: bool, deadline: float) -> list[dict]:
    """Multi-LoRA delta (pallas_kernels/lora, bf16, 4 adapter slots) at Llama-3-8B shapes, per token count T and
    number of distinct adapters in use (contiguous runs of tokens, as requests): the Pallas kernel (its error against
    the float32 reference checked first), the XLA reference (it applies every slot, so one row per T) and the base
    bf16 dense dot x @ W of the same (K, N), so that x_dense = us / the dense dot's us is the LoRA overhead; then the
    kernel under a few knob settings at T = 1 and 256."""
    from pallas_kernels.lora import lora_delta, lora_delta_reference
    from pallas_kernels.lora.testing import GPU_TOLERANCE, random_case, relative_error

    tol = GPU_TOLERANCE[jnp.dtype(jnp.bfloat16)]
    shapes = ((200, 72, 48),) if interpret else (  # (K, N, R)
        (4096, 6144, 48), (4096, 28672, 32), (14336, 4096, 16), (4096, 4096, 16))  # q|k|v, gate|up, down, o
    token_counts = (1, 20) if interpret else (1, 16, 64, 256)
    sweeps = ((20, [dict(block_m=16, split_k=2)]),) if interpret else (
        (1, [{}, dict(block_n=64), dict(block_n=256), dict(block_k=64), dict(block_k=256), dict(split_k=1),
             dict(split_k=4), dict(split_k=64), dict(num_warps=8), dict(num_stages=3)]),
        (256, [{}, dict(block_m=16), dict(block_m=32), dict(block_m=128), dict(block_n=64), dict(block_n=256),
               dict(split_k=1), dict(split_k=16), dict(num_warps=8), dict(num_stages=3)]))
    kernel = jax.jit(functools.partial(lora_delta, interpret=interpret))
    reference = jax.jit(lora_delta_reference)
    dense_dot = lambda x, w, *_: jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())),  # w [N, K]
                                                     preferred_element_type=jnp.float32)

    def timed(fn, args, base_us: float | None = None) -> dict:
        def chained(x, *rest):  # x-shaped and dependent on the whole result, which the barrier keeps whole
            y = jax.lax.optimization_barrier(fn(x, *rest))  # [T, N]
            return x + (y[0, 0] * 0).astype(x.dtype)
        us = median_call_seconds(chained, args, profile) * 1e6
        return {"us": us, **({"x_dense": us / base_us} if base_us else {})}

    def checked_then_timed(case, knobs: dict, base_us: float) -> dict:
        with jax.default_matmul_precision("highest"):
            expected = np.asarray(reference(*case.args()))
        delta = jax.jit(functools.partial(lora_delta, interpret=interpret, **knobs)) if knobs else kernel
        out = np.asarray(delta(*case.args()))
        err = relative_error(out, expected)
        checks = {"rel_err": err, "max_abs_err": float(np.abs(out - expected).max()), "ok": bool(err < tol)}
        return {**checks, **timed(functools.partial(lora_delta, interpret=interpret, **knobs), case.args(), base_us)}

    rows, dense_us = [], {}
    for k, n, rank in shapes:
        shape = f"K{k} N{n} R{rank}"
        w = jax.random.normal(jax.random.key(k + n), (n, k), jnp.bfloat16)  # [N, K], the base weight
        for t in token_counts:
            cases = {d: random_case(t + d, t, k, n, rank, LORA_SLOTS, f"adapters:{d}", jnp.bfloat16)
                     for d in sorted({1, min(LORA_SLOTS, t)})}
            if out_of_time(deadline, "lora"):
                return rows
            row = measured({"kind": "delta", "shape": shape, "T": t, "impl": "bf16_dense"},
                           lambda: timed(dense_dot, (cases[1].x, w)))
            dense_us[shape, t] = row.get("us")
            rows.append(row)
            if out_of_time(deadline, "lora"):
                return rows
            rows.append(measured({"kind": "delta", "shape": shape, "T": t, "impl": "xla_reference"},
                                 lambda: timed(lora_delta_reference, cases[1].args(), dense_us[shape, t])))
            for d, case in cases.items():
                if out_of_time(deadline, "lora"):
                    return rows
                row = {"kind": "delta", "shape": shape, "T": t, "adapters": d, "impl": "lora_kernel"}
                rows.append(measured(row, functools.partial(checked_then_timed, case, {}, dense_us[shape, t])))
    k, n, rank = shapes[0]
    for t, knob_sets in sweeps:
        case = random_case(t, t, k, n, rank, LORA_SLOTS, f"adapters:{min(LORA_SLOTS, t)}", jnp.bfloat16)
        for knobs in knob_sets:
            if out_of_time(deadline, "lora"):
                return rows
            row = {"kind": "tuning", "shape": f"K{k} N{n} R{rank}", "T": t, "adapters": min(LORA_SLOTS, t),
                   "knobs": knobs or "defaults"}
            rows.append(measured(row, functools.partial(checked_then_timed, case, knobs,
                                                        dense_us.get((f"K{k} N{n} R{rank}", t)))))
    return rows


def section_tuning(profile: Profile, interpret: bool, deadline: float) -> list[dict]:
    """Kernel time for a few knob settings ({} = the defaults), to choose the defaults from measurements."""
    rows = []
    for kernel, name, seqs, knob_sets in profile.tuning:
        case = uniform_case(profile, seqs)
        for knobs in knob_sets:
            if out_of_time(deadline, "tuning"):
                return rows
            attend = functools.partial(kernel_fn(kernel, case.max_query_len, 0.1, interpret), **knobs)
            row = {"case": name, "kernel": kernel, "knobs": knobs or "defaults"}
            rows.append(measured(row, functools.partial(call_time, attend, case, profile)))
    return rows


# ---------------------------------------------------------------------------------------------------- driver


def run_sections(profile: Profile, interpret: bool, budget_s: float) -> dict:
    """Run every section; each may start new measurements until its share of the budget (cumulative) is used."""
    start = time.time()
    sections = [  # (name, run, end of its time window in seconds of DEFAULT_BUDGET_S, scaled to budget_s)
        ("environment", lambda deadline: section_environment(interpret), 0),
        ("correctness", lambda deadline: section_correctness(profile, interpret, deadline), 100),
        ("kernels", lambda deadline: section_kernels(profile, interpret, deadline), 200),
        ("end_to_end", lambda deadline: section_end_to_end(profile, interpret, deadline), 280),
        ("engine", lambda deadline: section_engine(profile, interpret, deadline), 360),
        ("awq", lambda deadline: section_awq(profile, interpret, deadline), 380),
        ("lora", lambda deadline: section_lora(profile, interpret, deadline), 440),
        ("tuning", lambda deadline: section_tuning(profile, interpret, deadline), DEFAULT_BUDGET_S),
    ]
    results = {}
    for name, run, end in sections:
        log(f"section {name}")
        section_start = time.perf_counter()
        try:
            results[name] = {"status": "ok", "rows": run(start + end / DEFAULT_BUDGET_S * budget_s)}
        except Exception:  # noqa: BLE001 - one failing section must not stop the others
            results[name] = {"status": "error", "rows": [], "error": traceback.format_exc()}
            log(f"section {name} FAILED:\n{results[name]['error']}")
        results[name]["seconds"] = time.perf_counter() - section_start
    return results


def summary_table(results: dict) -> str:
    """One aligned table per section."""
    lines = []
    for name, section in results.items():
        lines.append(f"== {name}: {section['status']} ({section['seconds']:.0f} s)")
        rows = section["rows"]
        if not rows:
            continue
        keys = list(dict.fromkeys(key for row in rows for key in row))
        cells = [keys] + [[_fmt(row.get(key, "")) for key in keys] for row in rows]
        widths = [max(len(line[i]) for line in cells) for i in range(len(keys))]
        lines += ["   " + "  ".join(cell.ljust(width) for cell, width in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-smoke", "--dry-run", action="store_true",
                        help="tiny shapes in interpret mode on the CPU: exercises everything but the GPU")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="stop starting new measurements after this")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        jax.config.update("jax_platforms", "cpu")
    elif jax.default_backend() != "gpu":
        parser.error(f"no GPU (default backend {jax.default_backend()!r}); use --cpu-smoke")
    profile, interpret = (SMOKE, True) if args.cpu_smoke else (GPU, False)

    results = run_sections(profile, interpret, args.budget_s)
    out_dir = os.environ.get("OUT", "gpu_check_out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(summary_table(results), flush=True)
    failed = [name for name, s in results.items() if s["status"] != "ok"]
    failed += [f"{name}: {row}" for name, s in results.items() for row in s["rows"]
               if "error" in row or row.get("ok") is False]
    log(f"wrote {out_dir}/gpu_check.json; " + (f"FAILED: {failed}" if failed else "all sections ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
