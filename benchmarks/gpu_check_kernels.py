"""The GPU check's kernel sections (benchmarks/gpu_check.py runs them after its goal measurements), and the section
context every section shares.

    correctness   each kernel vs the reference (f32 reference at highest matmul precision), Llama-3-8B shapes
                  among others; unused pool slots hold NaN, so a kernel that reads a masked lane fails
    kernels       median time per call of the reference (XLA), the ragged kernel and the split-KV kernel on
                  decode and prefill steps, decode bandwidth against the H200's 4.8 TB/s, and the time of the XLA
                  scatter that writes the step's K/V (it stays outside the kernels)
    awq           int4 AWQ dequant-matmul kernel (bf16 scales: its 16-bit dequantization; one fp16-scale row per
                  shape: its float32 path) vs a bf16 dot vs XLA dequantize + dot at Llama-3-8B shapes:
                  microseconds, fraction of the HBM roofline, error vs the reference; then a few knob settings
    lora          multi-LoRA delta kernel (shrink + expand) vs the XLA reference vs the base bf16 dense dot of the
                  same (K, N): error, microseconds, x_dense (time as a multiple of the dense dot's); then knobs
    tuning        (the attention part) kernel time for a few settings of the tiling knobs

Every section appends its rows to ctx.rows as they are measured, so a section that fails or is stopped keeps the
rows it has; a row whose measurement raised carries "error" instead of figures.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from jaxllm.model.kv_cache import write_kv
from pallas_kernels.paged_attention import (ragged_paged_attention, ragged_paged_attention_reference,
                                            split_kv_paged_attention)
from pallas_kernels.paged_attention.testing import (poison_unused_slots, random_ragged_case, reference_output,
                                                    relative_error)

PEAK_HBM_BYTES_S = 4.8e12  # H200
BLOCK_SIZE = 16
GPU_TOLERANCE = {"float32": 1e-2, "bfloat16": 3e-2}  # f32 dots run as TF32 inside the kernels
LORA_SLOTS = 4  # adapter slots held on the device in the lora section; 1 or 4 of them used by a step's tokens


# ---------------------------------------------------------------------------------------------------- context


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclasses.dataclass
class Section:
    """One section's run: its profile, its deadline, the rows measured so far, and state shared between sections
    (the goal sections' 8B params and step times)."""

    name: str
    profile: object  # gpu_check.Profile
    interpret: bool
    deadline: float  # time.time() after which the section starts no new measurement
    hard_end: float  # time.time() after which nothing starts at all (the whole run's budget)
    state: dict
    rows: list = dataclasses.field(default_factory=list)

    def can_start(self, estimate_s: float = 0.0, what: str = "") -> bool:
        """Whether a measurement expected to take estimate_s may start now: before the section's deadline, and
        ending within the run's budget."""
        return self._allowed(time.time() < self.deadline, estimate_s, what, "past the section's deadline")

    def fits_window(self, estimate_s: float, what: str) -> bool:
        """Whether an optional measurement (a goal's second context) would end before the section's deadline, so
        that it takes no time from the sections after it."""
        return self._allowed(time.time() + estimate_s <= self.deadline, estimate_s, what,
                             "would end past the section's deadline")

    def fits_budget(self, estimate_s: float, what: str) -> bool:
        """Whether a goal's first measurement would end within the run's budget, whatever the section's window:
        goals come first, even when the ones before them ran long."""
        return self._allowed(True, estimate_s, what, "")

    def _allowed(self, in_window: bool, estimate_s: float, what: str, why_not: str) -> bool:
        if not in_window:
            log(f"  {self.name}: {what or 'the rest'} (~{estimate_s:.0f} s) skipped: {why_not}")
            return False
        if time.time() + estimate_s > self.hard_end:
            log(f"  {self.name}: {what or 'the rest'} (~{estimate_s:.0f} s) skipped: would end past the budget")
            return False
        return True

    def measure(self, row: dict, measure) -> dict:
        """`row` updated with the dict measure() returns, or with the error it raised, appended to the rows: one
        failure hides nothing else."""
        self.rows.append(row)
        try:
            row.update(measure())
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"  FAILED {row}\n{traceback.format_exc()}")
        else:
            log("  " + "  ".join(f"{k}={fmt(v)}" for k, v in row.items()))
        return row


def fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def median_call_seconds(fn, args, profile) -> float:
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


def kernel_fn(name: str, max_query_len: int, sm_scale: float, interpret: bool, **options):
    """Attention function (q, k_pool, v_pool, layer, tables, context_lens, query_start_loc) -> [T, Hq, D].
    options: sliding_window, logit_softcap."""
    kernels = {"reference": ragged_paged_attention_reference, "ragged": ragged_paged_attention,
               "split_kv": split_kv_paged_attention}
    extra = {} if name == "reference" else dict(interpret=interpret, max_query_len=max_query_len)
    return functools.partial(kernels[name], sm_scale=sm_scale, **extra, **options)


def uniform_case(profile, seqs, dtype=jnp.bfloat16, **layout):
    return random_ragged_case(0, seqs, dtype=dtype, num_layers=1, device_rng=True, **dict(profile.attn, **layout))


# ---------------------------------------------------------------------------------------------------- attention


def section_correctness(ctx: Section) -> None:
    """Each kernel on a NaN-poisoned pool vs the reference on the clean one; padding tokens must come out 0. A case's
    optional fifth field holds attention options (sliding_window, logit_softcap), given to both."""
    for name, kernels, seqs, layout, *rest in ctx.profile.correctness:
        options = rest[0] if rest else {}
        for dtype in (jnp.bfloat16, jnp.float32):
            if not ctx.can_start():
                return
            case = random_ragged_case(len(ctx.rows), seqs, dtype=dtype, pad_seqs=2, pad_tokens=3,
                                      **dict(ctx.profile.attn, **layout))
            sm_scale = case.q.shape[-1] ** -0.5
            with jax.default_matmul_precision("highest"):
                expected = reference_output(case, sm_scale, **options)
            poisoned = poison_unused_slots(case, float("nan"))
            tol = GPU_TOLERANCE[jnp.dtype(dtype).name]
            for kernel in kernels:
                row = {"case": name, "kernel": kernel, "dtype": jnp.dtype(dtype).name, "tol": tol, "ok": False}
                attend = jax.jit(kernel_fn(kernel, case.max_query_len, sm_scale, ctx.interpret, **options))
                ctx.measure(row, functools.partial(compare, attend, poisoned, expected, tol))


def compare(attend, case, expected: np.ndarray, tol: float) -> dict:
    """attend(*case.args()) vs expected on the valid tokens; the padding tokens' rows must be zeros."""
    out = np.asarray(attend(*case.args()), np.float32)
    valid = case.num_valid_tokens
    err = relative_error(out[:valid], expected[:valid])
    return {"rel_err": err, "ok": bool(err < tol and np.all(out[valid:] == 0))}


def section_kernels(ctx: Section) -> None:
    """Decode: reference vs both kernels, bandwidth; prefill/mixed: reference vs the ragged kernel; K/V write."""
    profile = ctx.profile
    for batch, context in profile.decode:
        if not ctx.can_start():
            return
        case = uniform_case(profile, [(1, context)] * batch)
        _, _, num_kv_heads, _, head_dim = case.k_pool.shape
        moved = (2 * batch * context * num_kv_heads * head_dim + 2 * case.q.size) * case.q.dtype.itemsize
        for impl in ("reference", "ragged", "split_kv"):
            row = {"kind": "decode", "case": f"b{batch} ctx{context}", "impl": impl}
            ctx.measure(row, functools.partial(call_time, kernel_fn(impl, 1, 0.1, ctx.interpret), case, profile,
                                               bytes_moved=moved))
        ctx.measure({"kind": "kv_write", "case": f"b{batch} ctx{context}", "impl": "xla_scatter"},
                    functools.partial(kv_write_time, case, profile))
    for name, seqs in profile.prefill:
        if not ctx.can_start():
            return
        case = uniform_case(profile, seqs)
        flops = sum(4 * case.q.shape[1] * case.q.shape[2] * sum(range(c - q + 1, c + 1)) for q, c in seqs)
        for impl in ("reference", "ragged"):
            ctx.measure({"kind": "prefill", "case": name, "impl": impl}, functools.partial(
                call_time, kernel_fn(impl, case.max_query_len, 0.1, ctx.interpret), case, profile, flops=flops))
        ctx.measure({"kind": "kv_write", "case": name, "impl": "xla_scatter"},
                    functools.partial(kv_write_time, case, profile))


def call_time(attend, case, profile, *, bytes_moved: int = 0, flops: int = 0) -> dict:
    """Median time of attend(*case.args()) and the bandwidth or compute rate it implies."""
    sec = median_call_seconds(attend, case.args(), profile)
    row = {"ms": sec * 1e3}
    if bytes_moved:
        row.update({"GB/s": bytes_moved / sec / 1e9, "%peak_hbm": 100 * bytes_moved / sec / PEAK_HBM_BYTES_S})
    if flops:
        row["TFLOP/s"] = flops / sec / 1e12
    return row


def kv_write_time(case, profile) -> dict:
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


def section_attention_tuning(ctx: Section) -> None:
    """Kernel time for a few knob settings ({} = the defaults), to choose the defaults from measurements."""
    for kernel, name, seqs, knob_sets in ctx.profile.tuning:
        case = uniform_case(ctx.profile, seqs)
        for knobs in knob_sets:
            if not ctx.can_start():
                return
            attend = functools.partial(kernel_fn(kernel, case.max_query_len, 0.1, ctx.interpret), **knobs)
            row = {"kind": "attention_knobs", "case": name, "kernel": kernel, "knobs": knobs or "defaults"}
            ctx.measure(row, functools.partial(call_time, attend, case, ctx.profile))


# ---------------------------------------------------------------------------------------------------- int4 AWQ


def section_awq(ctx: Section) -> None:
    """Int4 AWQ matmul (pallas_kernels/awq_matmul, group size 128) per (K, N) and M: the fused kernel with bf16
    scales (its error against the float32 reference checked first), a bf16 dense dot and XLA dequantize + dot, and
    at the first M the kernel with fp16 scales (the float32 dequantization path bf16 activations take with the
    checkpoint's own scales); then the kernel under a few knob settings. %hbm: an implementation's least bytes (its
    weight format, scales and zeros, bf16 x, float32 y) per second against the H200's 4.8 TB/s."""
    from pallas_kernels.awq_matmul import awq_matmul, dequantize
    from pallas_kernels.awq_matmul.testing import device_random_packed, random_activations

    group, interpret = 128, ctx.interpret
    impls = {
        "bf16_dense": dense_dot,
        "awq_kernel": functools.partial(awq_matmul, interpret=interpret),
        "xla_dequant_dot": lambda x, p: jnp.dot(x, dequantize(p, x.dtype), preferred_element_type=jnp.float32),
    }
    for k, n in ctx.profile.awq_shapes:
        packed = device_random_packed(0, k, n, group, jnp.bfloat16)  # scales in x's dtype: the fast dequantization
        packed_f16 = device_random_packed(0, k, n, group, jnp.float16)
        dense = jax.block_until_ready(jax.jit(lambda p: dequantize(p, jnp.bfloat16).T)(packed))  # [N, K]
        int4_bytes = k * n // 2 + 3 * (k // group) * n  # packed weights, 16-bit scales, int8 zeros
        for m in ctx.profile.awq_batch_sizes:
            x = random_activations(m, m, k, jnp.bfloat16)  # [M, K]
            io_bytes = 2 * m * k + 4 * m * n
            runs = [(impl, dense if impl == "bf16_dense" else packed, "bfloat16") for impl in impls]
            if m == ctx.profile.awq_batch_sizes[0]:
                runs.insert(2, ("awq_kernel", packed_f16, "float16"))
            for impl, w, scales in runs:
                if not ctx.can_start():
                    return
                moved = (2 * k * n if impl == "bf16_dense" else int4_bytes) + io_bytes
                row = {"kind": "matmul", "shape": f"K{k} N{n}", "M": m, "impl": impl,
                       "scales": None if impl == "bf16_dense" else scales}
                checked = impl == "awq_kernel"
                ctx.measure(row, functools.partial(awq_checked_then_timed if checked else matmul_timed,
                                                   impls[impl], x, w, moved, ctx.profile))
        for m, knob_sets in ctx.profile.awq_sweeps:
            x = random_activations(m, m, k, jnp.bfloat16)
            for knobs in knob_sets:
                if not ctx.can_start():
                    return
                row = {"kind": "tuning", "shape": f"K{k} N{n}", "M": m, "knobs": knobs or "defaults"}
                matmul = functools.partial(awq_matmul, interpret=interpret, **knobs)
                ctx.measure(row, functools.partial(matmul_timed, matmul, x, packed,
                                                   int4_bytes + 2 * m * k + 4 * m * n, ctx.profile))


def dense_dot(x, w):
    """x [M, K] @ w [N, K].T -> [M, N] float32."""
    return jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def chained(fn):
    """fn(x, *rest) -> [M, N] turned into an x-shaped result that depends on the whole product (the barrier keeps
    it whole), so median_call_seconds can feed it back."""
    def run(x, *rest):
        y = jax.lax.optimization_barrier(fn(x, *rest))
        return x + (y[0, 0] * 0).astype(x.dtype)
    return run


def matmul_timed(matmul, x, w, moved: int, profile) -> dict:
    sec = median_call_seconds(chained(matmul), (x, w), profile)
    flops = 2 * x.shape[0] * x.shape[1] * (w.n if hasattr(w, "n") else w.shape[0])
    return {"us": sec * 1e6, "%hbm": 100 * moved / sec / PEAK_HBM_BYTES_S, "TFLOP/s": flops / sec / 1e12}


def awq_checked_then_timed(matmul, x, packed, moved: int, profile) -> dict:
    from pallas_kernels.awq_matmul import awq_matmul_reference
    from pallas_kernels.awq_matmul.testing import TOLERANCE

    with jax.default_matmul_precision("highest"):
        expected = np.asarray(jax.jit(awq_matmul_reference)(x, packed))
    out = np.asarray(jax.jit(matmul)(x, packed))
    err = relative_error(out, expected)
    checks = {"rel_err": err, "max_abs_err": float(np.abs(out - expected).max()),
              "ok": bool(err < TOLERANCE[jnp.dtype(jnp.bfloat16)])}
    return {**checks, **matmul_timed(matmul, x, packed, moved, profile)}


# ---------------------------------------------------------------------------------------------------- LoRA


def section_lora(ctx: Section) -> None:
    """Multi-LoRA delta (pallas_kernels/lora, bf16, 4 adapter slots) per (K, N, R), token count T and number of
    distinct adapters in use (contiguous runs of tokens, as requests): the Pallas kernel (its error against the
    float32 reference checked first), the XLA reference (it applies every slot, so one row per T) and the base bf16
    dense dot x @ W of the same (K, N), so that x_dense = us / the dense dot's us is the LoRA overhead; then the
    kernel under a few knob settings."""
    from pallas_kernels.lora import lora_delta_reference
    from pallas_kernels.lora.testing import random_case

    dense_us = {}
    for k, n, rank in ctx.profile.lora_shapes:
        shape = f"K{k} N{n} R{rank}"
        w = jax.random.normal(jax.random.key(k + n), (n, k), jnp.bfloat16)  # [N, K], the base weight
        for t in ctx.profile.lora_token_counts:
            cases = {d: random_case(t + d, t, k, n, rank, LORA_SLOTS, f"adapters:{d}", jnp.bfloat16)
                     for d in sorted({1, min(LORA_SLOTS, t)})}
            if not ctx.can_start():
                return
            row = ctx.measure({"kind": "delta", "shape": shape, "T": t, "impl": "bf16_dense"},
                              lambda: lora_timed(dense_dot, (cases[1].x, w), ctx.profile))
            dense_us[shape, t] = row.get("us")
            if not ctx.can_start():
                return
            ctx.measure({"kind": "delta", "shape": shape, "T": t, "impl": "xla_reference"},
                        lambda: lora_timed(lora_delta_reference, cases[1].args(), ctx.profile, dense_us[shape, t]))
            for d, case in cases.items():
                if not ctx.can_start():
                    return
                row = {"kind": "delta", "shape": shape, "T": t, "adapters": d, "impl": "lora_kernel"}
                ctx.measure(row, functools.partial(lora_checked_then_timed, ctx, case, {}, dense_us[shape, t]))
    k, n, rank = ctx.profile.lora_shapes[0]
    for t, knob_sets in ctx.profile.lora_sweeps:
        case = random_case(t, t, k, n, rank, LORA_SLOTS, f"adapters:{min(LORA_SLOTS, t)}", jnp.bfloat16)
        for knobs in knob_sets:
            if not ctx.can_start():
                return
            row = {"kind": "tuning", "shape": f"K{k} N{n} R{rank}", "T": t, "adapters": min(LORA_SLOTS, t),
                   "knobs": knobs or "defaults"}
            ctx.measure(row, functools.partial(lora_checked_then_timed, ctx, case, knobs,
                                               dense_us.get((f"K{k} N{n} R{rank}", t))))


def lora_timed(fn, args, profile, base_us: float | None = None) -> dict:
    us = median_call_seconds(chained(fn), args, profile) * 1e6
    return {"us": us, **({"x_dense": us / base_us} if base_us else {})}


def lora_checked_then_timed(ctx: Section, case, knobs: dict, base_us: float | None) -> dict:
    from pallas_kernels.lora import lora_delta, lora_delta_reference
    from pallas_kernels.lora.testing import GPU_TOLERANCE as LORA_TOLERANCE

    delta = functools.partial(lora_delta, interpret=ctx.interpret, **knobs)
    with jax.default_matmul_precision("highest"):
        expected = np.asarray(jax.jit(lora_delta_reference)(*case.args()))
    out = np.asarray(jax.jit(delta)(*case.args()))
    err = relative_error(out, expected)
    checks = {"rel_err": err, "max_abs_err": float(np.abs(out - expected).max()),
              "ok": bool(err < LORA_TOLERANCE[jnp.dtype(jnp.bfloat16)])}
    return {**checks, **lora_timed(delta, case.args(), ctx.profile, base_us)}


# ---------------------------------------------------------------------------------------------------- MoE


def section_moe(ctx: Section) -> None:
    """Mixture-of-experts experts MLP (pallas_kernels/moe, bf16, ctx.profile.moe_shape = (E, H, I, k): Qwen3-30B-A3B's
    layer) per token count T with uniform random routing: the Pallas grouped matmul (its error against the jnp
    reference checked first), the reference (every expert on every token) and a dense gated MLP of the active width
    (intermediate k * I) for the ratio x_dense. %hbm: the distinct experts the routing touches (their weights read
    once) per second against the H200's 4.8 TB/s."""
    from pallas_kernels.moe import moe_experts_pallas, moe_experts_reference

    num_experts, hidden, inter, top_k = ctx.profile.moe_shape
    w_gate_up, w_down = device_expert_weights(num_experts, hidden, inter)  # [E, 2I, H], [E, H, I]
    dense_gate_up, dense_down = w_gate_up[0, :2 * inter].repeat(top_k, 0), w_down[0].repeat(top_k, 1)
    for t in ctx.profile.moe_token_counts:
        x, ids, weights = moe_routing(t, top_k, num_experts, hidden)
        touched = len(np.unique(np.asarray(ids)))
        moved = touched * 3 * hidden * inter * 2 + 4 * t * hidden
        impls = {"pallas": functools.partial(moe_experts_pallas, interpret=ctx.interpret),
                 "xla_reference": moe_experts_reference}
        if not ctx.can_start():
            return
        dense = ctx.measure({"kind": "moe", "T": t, "impl": "bf16_dense_active"},
                            lambda: moe_timed(dense_mlp, (x, dense_gate_up, dense_down), ctx.profile,
                                              3 * hidden * inter * top_k * 2))
        for impl, fn in impls.items():
            if not ctx.can_start():
                return
            row = {"kind": "moe", "T": t, "impl": impl, "experts_touched": touched}
            args = (x, ids, weights, w_gate_up, w_down)
            measure = moe_checked_then_timed if impl == "pallas" else moe_timed
            ctx.measure(row, functools.partial(measure, fn, args, ctx.profile, moved, dense.get("us")))


def device_expert_weights(num_experts: int, hidden: int, inter: int):
    """Random bf16 expert weights made on the device (the host would take seconds for Qwen3-30B-A3B's 1.2 G values
    per layer), scaled so every stage is O(1)."""
    k1, k2 = jax.random.split(jax.random.key(7))
    make = jax.jit(lambda: (
        (jax.random.normal(k1, (num_experts, 2 * inter, hidden), jnp.float32) / np.sqrt(hidden)).astype(jnp.bfloat16),
        (jax.random.normal(k2, (num_experts, hidden, inter), jnp.float32) / np.sqrt(inter)).astype(jnp.bfloat16)))
    return jax.block_until_ready(make())


def moe_routing(num_tokens: int, top_k: int, num_experts: int, hidden: int):
    """(x [T, H] bf16, ids [T, k] int32: k distinct experts per token, weights [T, k] float32)."""
    rng = np.random.default_rng(num_tokens)
    ids = np.stack([rng.permutation(num_experts)[:top_k] for _ in range(num_tokens)])
    x = jnp.asarray(rng.standard_normal((num_tokens, hidden), np.float32), jnp.bfloat16)
    return x, jnp.asarray(ids, jnp.int32), jnp.asarray(rng.random((num_tokens, top_k), np.float32))


def dense_mlp(x, w_gate_up, w_down):
    """The dense gated MLP of the active width: x [T, H], w_gate_up [2F, H], w_down [H, F] -> [T, H]."""
    gate, up = jnp.split(dense_dot(x, w_gate_up).astype(x.dtype), 2, axis=-1)
    return dense_dot(jax.nn.silu(gate) * up, w_down).astype(x.dtype)


def moe_timed(fn, args, profile, moved: int, base_us: float | None = None) -> dict:
    us = median_call_seconds(chained(fn), args, profile) * 1e6
    return {"us": us, "%hbm": 100 * moved / (us * 1e-6) / PEAK_HBM_BYTES_S,
            **({"x_dense": us / base_us} if base_us else {})}


def moe_checked_then_timed(fn, args, profile, moved: int, base_us: float | None) -> dict:
    from pallas_kernels.moe import moe_experts_reference
    from pallas_kernels.moe.testing import TOLERANCE

    with jax.default_matmul_precision("highest"):
        expected = np.asarray(jax.jit(moe_experts_reference)(*args).astype(jnp.float32))
    out = np.asarray(jax.jit(fn)(*args).astype(jnp.float32))
    err = float(np.abs(out - expected).max() / max(np.abs(expected).max(), 1e-30))
    checks = {"rel_err": err, "ok": bool(err < TOLERANCE[jnp.dtype(jnp.bfloat16)])}
    return {**checks, **moe_timed(fn, args, profile, moved, base_us)}
