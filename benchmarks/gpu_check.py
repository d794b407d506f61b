"""GPU check for one 10-minute call on an H200: the goal measurements first, then the Pallas kernels against their
references, then sweeps. Every section prints one `GPU_CHECK_JSON {...}` line and appends it to
$OUT/gpu_check.jsonl the moment it ends, so a run killed at any point keeps every section it finished.

    timeout 600 python benchmarks/gpu_check.py 2>&1 | tee $OUT/gpu_check.log    # one H200 (README, Benchmarks)
    python benchmarks/gpu_check.py --cpu-smoke    # the same code path with tiny shapes, interpret mode, on a CPU

Run from the repository root (the repository is put on sys.path; nothing needs installing). Sections, in order,
each in its own try block (a failing section is reported and the rest still run):

    environment       versions, device, XLA flags, the budget
    goal_decode_bf16  Llama-3-8B, random bf16 weights made on the device, batch 1 at context 1024 (then 4096),
                      Pallas attention through jit_forward with the cache donated: compile seconds, median step
                      ms, the bytes the step must read (weights + the context's K/V; jaxllm.benchmarks.step_bytes),
                      achieved GB/s and % of the H200's 4.8 TB/s
    goal_int4         the same step with every linear int4 AWQ (group 128, bf16 scales: the kernel's fast
                      dequantization) generated on the device: step ms, bytes, % roofline, speed-up over bf16;
                      then one row with fp16 scales (the float32 dequantization path) if time allows
    goal_engine       LLMEngine on the same bf16 params, Pallas attention, max_num_seqs 256: warm-up by one short
                      wave of the workload's shape (the programs it compiled, each one's seconds), then 512 requests
                      of 128 random prompt tokens and 128 output tokens: output tokens/s, and the programs compiled
                      after warm-up (must be 0)
    correctness, kernels, awq, lora, moe   benchmarks/gpu_check_kernels.py: kernels vs references, kernel timings
    tuning            XLA's default compile options against this script's (one 8B decode step: compile seconds and
                      step ms), then attention kernel knob settings

Budget: --budget-s (default 480) seconds from the start of the process, split into one window per section (SECTIONS:
goals first, and the largest share, 330 s). A section starts no measurement after its window ends; a goal's first
measurement starts whenever it can still end within the budget (goals come first even when an earlier one ran
long), its optional ones (context 4096, fp16 scales) only if they end within its window; nothing starts that is
expected to end past the budget (estimates from the first 8B compile). Compiles are kept short by the XLA flags
below (in the environment section's row; --xla-defaults leaves XLA's own), so that the whole run, Python and every
compile included, ends well inside `timeout 600`. --sections runs some of them (a rerun of those a run missed).

Results: $OUT/gpu_check.jsonl (one line per section, as it ends), $OUT/gpu_check.json (all of it, at the end;
OUT defaults to ./gpu_check_out) and a summary table printed last. Exit status 0 when every section and row is ok.
"""

from __future__ import annotations

import time

START = time.time()  # the budget counts from here: the interpreter's own start is a fraction of a second before

import os  # noqa: E402
import sys  # noqa: E402

# Compile options that keep each compile short, set before JAX starts. XLA's GEMM autotuner (level 4 by default)
# compiles and times many Triton tilings per distinct dot (q|k|v, o, gate|up, down and the LM head in a Llama
# forward, at each token count) and checks each against a reference, and the run compiles about ten 8B programs.
# At level 0 each GEMM fusion keeps its default Triton tiling, with no timing runs. Triton GEMMs stay on: with
# cuBLAS instead, a batch-1 step's bf16 x bf16 -> float32 matrix-vector products make XLA convert every weight to
# float32 first (seen in the deviceless compile: 5.9x the bytes). The tuning section compiles and times one step
# under XLA's defaults too, so what this choice costs in step time is measured, not assumed.
FAST_COMPILE_XLA_FLAGS = ("--xla_gpu_autotune_level=0",)
XLA_DEFAULT_OPTIONS = {"xla_gpu_autotune_level": 4}  # as compiler_options


def set_xla_flags(argv: list[str]) -> str:
    """Add FAST_COMPILE_XLA_FLAGS to $XLA_FLAGS (a flag already named there is left as given), unless
    --xla-defaults is in argv; returns the value JAX will start with."""
    given = os.environ.get("XLA_FLAGS", "")
    if "--xla-defaults" not in argv:
        named = {flag.split("=")[0] for flag in given.split()}
        given = " ".join([given] + [f for f in FAST_COMPILE_XLA_FLAGS if f.split("=")[0] not in named]).strip()
        os.environ["XLA_FLAGS"] = given
    return given


XLA_FLAGS = set_xla_flags(sys.argv)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import traceback  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # the repository (jaxllm, pallas_kernels) and gpu_check_kernels

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gpu_check_kernels as kernels  # noqa: E402
from gpu_check_kernels import BLOCK_SIZE, PEAK_HBM_BYTES_S, Section, fmt, log  # noqa: E402
from jaxllm.benchmarks.model_presets import model_preset  # noqa: E402
from jaxllm.benchmarks.random_weights import device_random_awq_params, device_random_params  # noqa: E402
from jaxllm.benchmarks.step_bytes import decode_step_bytes  # noqa: E402
from jaxllm.compile_counter import CompileCounter  # noqa: E402
from jaxllm.config import ModelConfig  # noqa: E402
from jaxllm.engine.args import EngineArgs  # noqa: E402
from jaxllm.engine.engine import LLMEngine  # noqa: E402
from jaxllm.loaders import LoadedModel  # noqa: E402
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, select_kernels  # noqa: E402
from jaxllm.model.params import param_bytes  # noqa: E402
from jaxllm.sampling_params import SamplingParams  # noqa: E402

DEFAULT_BUDGET_S = 480.0  # --budget-s: seconds from the process's start after which no measurement starts
LLAMA3_8B_ATTN = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=BLOCK_SIZE)
SMOLLM2_ATTN = dict(num_q_heads=9, num_kv_heads=3, head_dim=64)
GEMMA2_9B_ATTN = dict(num_q_heads=16, num_kv_heads=8, head_dim=256)  # local layers: window 4096, soft-cap 50
GEMMA2_LOCAL = dict(sliding_window=4096, logit_softcap=50.0)


@dataclasses.dataclass(frozen=True)
class Profile:
    # goals
    goal_model: ModelConfig
    goal_contexts: tuple  # batch-1 decode contexts, in order; the later ones only if time allows
    goal_steps: int  # timed decode steps per row
    awq_group: int
    engine: dict  # EngineArgs fields of goal_engine
    engine_requests: int
    engine_prompt_len: int
    engine_output_len: int
    # kernel sections (gpu_check_kernels.py)
    attn: dict  # attention layout of the kernel benchmarks
    correctness: tuple  # (name, kernels, [(q_len, context)], layout overrides[, attention options])
    decode: tuple  # (batch, context) per decode benchmark
    prefill: tuple  # (name, [(q_len, context)]) per prefill / mixed benchmark
    awq_shapes: tuple  # (K, N)
    awq_batch_sizes: tuple  # M
    awq_sweeps: tuple  # (M, [knob overrides])
    lora_shapes: tuple  # (K, N, R)
    lora_token_counts: tuple
    lora_sweeps: tuple  # (T, [knob overrides])
    moe_shape: tuple  # (E, H, I, k) of the moe section
    moe_token_counts: tuple
    tuning: tuple  # (kernel, name, [(q_len, context)], [knob overrides]) per attention knob sweep
    iters: int  # calls per timing loop
    repeats: int  # timing loops; the median is reported


# The engine workload is shaped so that its programs are few: a wave of max_num_seqs prompts fills the token budget
# exactly (256 x 128 = 32768), so every prefill step is one T = 32768 forward, the wave then decodes together
# (decode-only T = 256) and finishes together (no tail of smaller batches), and the next wave does the same: three
# programs in all (forward T = 32768, forward decode-only T = 256, sample S = 256), compiled by the warm-up wave.
GPU_ENGINE = dict(max_num_seqs=256, max_num_batched_tokens=256 * 128, max_model_len=128 + 128)

GPU = Profile(
    goal_model=model_preset("llama3-8b"),
    goal_contexts=(1024, 4096),
    goal_steps=30,
    awq_group=128,
    engine=GPU_ENGINE,
    engine_requests=512,
    engine_prompt_len=128,
    engine_output_len=128,
    attn=LLAMA3_8B_ATTN,
    correctness=(
        ("llama3_8b_decode", ("split_kv", "ragged"), [(1, c) for c in (1, 16, 17, 333, 1000, 4096)], {}),
        ("llama3_8b_mixed", ("ragged",), [(1, 1000), (1, 17), (128, 128), (37, 300), (1, 4000)], {}),
        ("llama3_8b_long_prefill", ("ragged",), [(1024, 2048), (300, 300)], {}),
        ("smollm2_mixed", ("ragged",), [(1, 500), (64, 64), (9, 90)], SMOLLM2_ATTN),
        ("smollm2_decode", ("split_kv",), [(1, 500), (1, 3), (1, 2049)], SMOLLM2_ATTN),
        ("mha_block32", ("ragged", "split_kv"), [(1, 700), (1, 33)], dict(num_q_heads=8, num_kv_heads=8,
                                                                           block_size=32)),
        ("gemma2_9b_local_decode", ("split_kv", "ragged"), [(1, c) for c in (1, 17, 4096, 4097, 6000)],
         GEMMA2_9B_ATTN, GEMMA2_LOCAL),
        ("gemma2_9b_local_mixed", ("ragged",), [(1, 5000), (128, 128), (300, 4500), (1, 30)], GEMMA2_9B_ATTN,
         GEMMA2_LOCAL),
        ("gemma2_9b_global_prefill", ("ragged",), [(1024, 2048), (1, 900)], GEMMA2_9B_ATTN, dict(logit_softcap=50.0)),
        ("llama3_8b_window_999", ("ragged", "split_kv"), [(1, 3000), (1, 500), (1, 999)], {},
         dict(sliding_window=999)),
    ),
    decode=((1, 4096), (64, 1024), (256, 2048)),
    prefill=(
        ("chunk 512 @2048 + 63 decode @1024", [(512, 2048)] + [(1, 1024)] * 63),
        ("2048 prompt", [(2048, 2048)]),
    ),
    awq_shapes=((4096, 14336), (14336, 4096)),
    awq_batch_sizes=(1, 16, 64, 256),
    awq_sweeps=((1, [{}, dict(block_n=64), dict(block_n=256), dict(block_k=512), dict(split_k=8),
                     dict(num_warps=8)]),
                (256, [{}, dict(block_m=128), dict(block_n=256), dict(num_warps=8), dict(num_stages=4)])),
    lora_shapes=((4096, 6144, 48), (4096, 28672, 32)),  # q|k|v, gate|up
    lora_token_counts=(1, 16, 256),
    lora_sweeps=((1, [{}, dict(block_n=256), dict(split_k=4), dict(num_warps=8)]),
                 (256, [{}, dict(block_m=32), dict(block_n=256), dict(num_warps=8)])),
    moe_shape=(128, 2048, 768, 8),  # Qwen3-30B-A3B's experts
    moe_token_counts=(1, 16, 256),
    tuning=(
        ("split_kv", "decode b8 ctx8192", [(1, 8192)] * 8,
         [dict(block_kv=32), {}, dict(block_kv=128), dict(num_warps=8), dict(num_stages=3), dict(num_splits=64)]),
        ("ragged", "prefill 2048", [(2048, 2048)],
         [{}, dict(block_kv=128), dict(block_q=32), dict(block_q=32, num_warps=8), dict(num_stages=3)]),
    ),
    iters=20,
    repeats=5,
)

SMOKE = Profile(
    goal_model=model_preset("tiny"),
    goal_contexts=(24, 40),
    goal_steps=2,
    awq_group=128,
    engine=dict(max_num_seqs=4, max_num_batched_tokens=4 * 8, max_model_len=8 + 4),
    engine_requests=8,
    engine_prompt_len=8,
    engine_output_len=4,
    attn=dict(num_q_heads=8, num_kv_heads=2, head_dim=64, block_size=BLOCK_SIZE),
    correctness=(("tiny_mixed", ("ragged",), [(1, 40), (9, 20)], {}),
                 ("tiny_decode", ("split_kv",), [(1, 40), (1, 3)], {}),
                 ("tiny_window_softcap", ("split_kv",), [(1, 40), (1, 3)], {},
                  dict(sliding_window=7, logit_softcap=5.0))),
    decode=((2, 64),),
    prefill=(("prompt 32", [(32, 32)]),),
    awq_shapes=((256, 40),),
    awq_batch_sizes=(1, 20),
    awq_sweeps=((1, [dict(block_n=32)]), (20, [dict(block_m=16)])),
    lora_shapes=((200, 72, 48),),
    lora_token_counts=(1, 20),
    lora_sweeps=((20, [dict(block_m=16, split_k=2)]),),
    moe_shape=(8, 64, 32, 2),
    moe_token_counts=(1, 12),
    tuning=(("split_kv", "decode b2 ctx64", [(1, 64)] * 2, [dict(block_kv=16, num_splits=2)]),),
    iters=1,
    repeats=1,
)


# ---------------------------------------------------------------------------------------------------- goals


def section_environment(ctx: Section) -> None:
    device = jax.devices()[0]
    memory = getattr(device, "memory_stats", lambda: None)() or {}
    ctx.rows.append({
        "jax": jax.__version__, "backend": jax.default_backend(), "device": device.device_kind,
        "num_devices": jax.device_count(), "platform_version": getattr(device.client, "platform_version", None),
        "device_memory_GB": memory.get("bytes_limit", 0) / 1e9 or None, "python": sys.version.split()[0],
        "interpret": ctx.interpret, "xla_flags": XLA_FLAGS, "budget_s": ctx.hard_end - START,
        "startup_s": time.time() - START})


def section_goal_decode_bf16(ctx: Section) -> None:
    """Batch-1 decode of the 8B model in bf16 at each goal context: the step against its HBM roofline."""
    config = ctx.profile.goal_model
    if not ctx.fits_budget(0.0, "the bf16 goal"):
        return
    params = generated(ctx, "bf16", lambda: device_random_params(config, 0, jnp.bfloat16))
    ctx.state["bf16_params"] = params
    for i, context in enumerate(ctx.profile.goal_contexts):
        estimate = ctx.state.get("forward_compile_s", 0.0) + 5.0
        if i > 0 and not ctx.fits_window(estimate, f"bf16 context {context}"):
            return
        row = ctx.measure({"weights": "bf16", "batch": 1, "context": context},
                          functools.partial(decode_row, ctx.profile, params, context))
        ctx.state.setdefault("bf16_step_ms", {})[context] = row.get("step_ms")
        ctx.state.setdefault("forward_compile_s", row.get("compile_s", 0.0))


def section_goal_int4(ctx: Section) -> None:
    """The same step with every linear int4 AWQ (bf16 scales; then one fp16-scale row), against the bf16 step."""
    config, profile = ctx.profile.goal_model, ctx.profile
    estimate = 1.5 * ctx.state.get("forward_compile_s", 0.0) + 5.0  # the AWQ kernel's compile on top
    runs = [(jnp.bfloat16, context) for context in profile.goal_contexts] + [(jnp.float16, profile.goal_contexts[0])]
    params, params_scales = None, None
    for i, (scale_dtype, context) in enumerate(runs):
        what = f"int4 {jnp.dtype(scale_dtype).name} scales, context {context}"
        if not (ctx.fits_window(estimate, what) if i else ctx.fits_budget(estimate, what)):
            return
        if params_scales != scale_dtype:
            params = None  # the previous int4 params go before the next are made
            params = generated(ctx, f"int4 {jnp.dtype(scale_dtype).name} scales", lambda: device_random_awq_params(
                config, 1, jnp.bfloat16, profile.awq_group, scale_dtype, base=ctx.state.get("bf16_params")))
            params_scales = scale_dtype
        row = {"weights": f"int4 awq g{profile.awq_group}", "scales": jnp.dtype(scale_dtype).name, "batch": 1,
               "context": context}
        ctx.measure(row, functools.partial(int4_row, ctx, params, context))


def int4_row(ctx: Section, params, context: int) -> dict:
    row = decode_row(ctx.profile, params, context)
    bf16_ms = ctx.state.get("bf16_step_ms", {}).get(context)
    return {**row, **({"speedup_vs_bf16": bf16_ms / row["step_ms"]} if bf16_ms else {})}


def generated(ctx: Section, what: str, make):
    """make() on the device, its seconds and bytes recorded as a row of the section."""
    start = time.perf_counter()
    params = jax.block_until_ready(make())
    ctx.rows.append({"kind": "params", "weights": what, "seconds": time.perf_counter() - start,
                     "GB": param_bytes(params) / 1e9})
    log(f"  {what} params: {ctx.rows[-1]['GB']:.2f} GB in {ctx.rows[-1]['seconds']:.1f} s")
    return params


def decode_row(profile: Profile, params, context: int, compiler_options: dict | None = None) -> dict:
    """One batch-1 decode step at `context` tokens (context - 1 cached, one new), Pallas attention, the cache
    donated: compile seconds, median step ms (each step waited for) and pipelined step ms (steps back to back, as
    the engine runs them), bytes it must read and the bandwidth that is."""
    config = profile.goal_model
    blocks = -(-context // BLOCK_SIZE)
    step = jax.device_put(build_step_batch([SequenceChunk([7], context - 1, list(range(1, blocks + 1)))],
                                           BLOCK_SIZE))
    cache = init_kv_cache(config, blocks + 1, BLOCK_SIZE, jnp.bfloat16)  # block 0 is the null block
    start = time.perf_counter()
    compiled = jit_forward(config, select_kernels("pallas")).lower(params, cache, step).compile(compiler_options)
    compile_s = time.perf_counter() - start
    log(f"  compiled the {config.num_layers}-layer decode step in {compile_s:.1f} s")
    waited_s, pipelined_s = time_decode_steps(compiled, params, cache, step, profile.goal_steps)
    moved = decode_step_bytes(params, config, 1, context, jnp.bfloat16)
    return {"compile_s": compile_s, "step_ms": waited_s * 1e3, "step_ms_pipelined": pipelined_s * 1e3,
            "weight_GB": moved["weights"] / 1e9, "kv_GB": moved["kv"] / 1e9,
            "GB/s": moved["total"] / waited_s / 1e9, "%roofline": 100 * moved["total"] / waited_s / PEAK_HBM_BYTES_S,
            "%roofline_pipelined": 100 * moved["total"] / pipelined_s / PEAK_HBM_BYTES_S,
            "roofline_ms": moved["total"] / PEAK_HBM_BYTES_S * 1e3}


def time_decode_steps(compiled, params, cache, step, steps: int) -> tuple[float, float]:
    """(median seconds of a step waited for, seconds per step of `steps` dispatched back to back)."""
    logits, cache = compiled(params, cache, step)
    logits.block_until_ready()  # the first run (buffers, kernels loaded)
    waited = []
    for _ in range(steps):
        start = time.perf_counter()
        logits, cache = compiled(params, cache, step)
        logits.block_until_ready()
        waited.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(steps):
        logits, cache = compiled(params, cache, step)
    logits.block_until_ready()
    return statistics.median(waited), (time.perf_counter() - start) / steps


def section_goal_engine(ctx: Section) -> None:
    """The whole engine at max_num_seqs 256 on the 8B bf16 params: output tokens/s of a fixed random workload."""
    profile = ctx.profile
    estimate = 3 * ctx.state.get("forward_compile_s", 0.0) + 30  # two forwards and a sampler; two runs
    if not ctx.fits_budget(estimate, "the engine run"):
        return
    params = ctx.state.get("bf16_params")
    if params is None:  # goal_decode_bf16 failed or was skipped before making them
        params = generated(ctx, "bf16", lambda: device_random_params(profile.goal_model, 0, jnp.bfloat16))
    row = {"max_num_seqs": profile.engine["max_num_seqs"],
           "max_num_batched_tokens": profile.engine["max_num_batched_tokens"],
           "max_model_len": profile.engine["max_model_len"], "requests": profile.engine_requests,
           "prompt_len": profile.engine_prompt_len, "output_len": profile.engine_output_len, "attention": "pallas"}
    ctx.measure(row, functools.partial(engine_throughput, profile, params))


def engine_throughput(profile: Profile, params) -> dict:
    """Engine built without its own warm-up (which compiles every bucket: 34 programs at the GPU sizes, 24 of them
    8B forwards), warmed by one wave of max_num_seqs requests of the workload's prompt length and 2 output tokens
    (a prefill step and a decode step: the programs the workload runs), then the workload, timed, with the
    programs it compiled counted (none, if the warm-up covered it)."""
    config, max_seqs = profile.goal_model, profile.engine["max_num_seqs"]
    blocks_per_seq = -(-profile.engine["max_model_len"] // BLOCK_SIZE)
    args = EngineArgs(skip_tokenizer=True, attention="pallas", warmup=False, async_scheduling=True,
                      compilation_cache=False,  # compile times are measured: nothing loaded from an earlier run
                      num_gpu_blocks=1 + 2 * max_seqs * blocks_per_seq, **profile.engine)
    start = time.perf_counter()
    engine = LLMEngine(args, loaded=LoadedModel(config, params, source=None))
    build_s = time.perf_counter() - start
    with ProgramLog() as programs, CompileCounter() as warmup_compiles:
        start = time.perf_counter()
        run_workload(engine, 0, max_seqs, profile.engine_prompt_len, 2)
        warmup_s = time.perf_counter() - start
    steps_before = engine.num_steps
    with CompileCounter() as compiles:
        start = time.perf_counter()
        tokens = run_workload(engine, 1, profile.engine_requests, profile.engine_prompt_len, profile.engine_output_len)
        seconds = time.perf_counter() - start
    prompt_tokens = profile.engine_requests * profile.engine_prompt_len
    return {"build_s": build_s, "warmup_s": warmup_s, "programs": engine.runner.num_compiled_programs,
            "program_compile_s": programs.seconds, "warmup_compiles": warmup_compiles.count,
            "seconds": seconds, "output_tokens": tokens, "output_tok_s": tokens / seconds,
            "total_tok_s": (tokens + prompt_tokens) / seconds, "steps": engine.num_steps - steps_before,
            "compiles_after_warmup": compiles.count,
            "ok": compiles.count == 0 and tokens == profile.engine_requests * profile.engine_output_len}


def run_workload(engine, seed: int, num_requests: int, prompt_len: int, output_len: int) -> int:
    """num_requests prompts of prompt_len random token ids (seeded: a later run shares no prefix with an earlier
    one), each generating exactly output_len tokens (ignore_eos, temperature 1); returns the output tokens."""
    rng = np.random.default_rng(seed)
    params = SamplingParams(temperature=1.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
    for i in range(num_requests):
        prompt = rng.integers(3, engine.model_config.vocab_size, size=prompt_len).tolist()
        engine.add_request(f"s{seed}-{i}", prompt, params)
    tokens = 0
    while engine.has_unfinished_requests():
        tokens += sum(len(c.token_ids) for out in engine.step() if out.finished for c in out.outputs)
    return tokens


class ProgramLog(logging.Handler):
    """The engine's programs built while active, {program: seconds}, from step_programs' "built program" log."""

    LOGGER = "jaxllm.engine.step_programs"

    def __init__(self):
        super().__init__(logging.INFO)
        self.seconds: dict[str, float] = {}
        self._logger = logging.getLogger(self.LOGGER)

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("built program") and len(record.args) >= 3:
            _, key, seconds = record.args[:3]
            self.seconds[str(key)] = float(seconds)
            log(f"  engine built {key} in {seconds:.1f} s")

    def __enter__(self) -> ProgramLog:
        self._level = self._logger.level
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


# ---------------------------------------------------------------------------------------------------- tuning


def section_tuning(ctx: Section) -> None:
    """XLA's default compile options vs this script's on the first goal step (bf16; it needs goal_decode_bf16's
    params and step time from the same run), then attention knobs."""
    params, context = ctx.state.get("bf16_params"), ctx.profile.goal_contexts[0]
    fast_compile_s = ctx.state.get("forward_compile_s", 0.0)
    if params is None:
        log("  tuning: no bf16 goal params in this run, so no XLA-defaults compile")
    elif ctx.can_start(max(30.0, 3 * fast_compile_s), "the XLA-defaults compile"):
        row = {"kind": "compile_options", "weights": "bf16", "context": context,
               "options": dict(XLA_DEFAULT_OPTIONS), "fast_compile_s": fast_compile_s,
               "fast_step_ms": ctx.state.get("bf16_step_ms", {}).get(context)}
        ctx.measure(row, functools.partial(decode_row, ctx.profile, params, context, XLA_DEFAULT_OPTIONS))
    kernels.section_attention_tuning(ctx)


# ---------------------------------------------------------------------------------------------------- driver


class Terminated(BaseException):
    """SIGTERM (timeout's signal) arrived: the running section records what it has, then the run stops."""


class SigtermGuard:
    """SIGTERM raises Terminated only inside a section's measurements (`interruptible`); anywhere else (writing a
    result, between sections) it marks the run as to be stopped, so that no line is half written or lost."""

    def __init__(self):
        self.requested = False
        self._interruptible = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True
        if self._interruptible:
            raise Terminated()

    @contextlib.contextmanager
    def interruptible(self):
        if self.requested:
            raise Terminated()
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False


SIGTERM = SigtermGuard()


SECTIONS = (  # (name, run, end of its window in seconds of DEFAULT_BUDGET_S, scaled to --budget-s)
    ("environment", section_environment, 0),
    ("goal_decode_bf16", section_goal_decode_bf16, 150),
    ("goal_int4", section_goal_int4, 240),
    ("goal_engine", section_goal_engine, 330),
    ("correctness", kernels.section_correctness, 365),
    ("kernels", kernels.section_kernels, 390),
    ("awq", kernels.section_awq, 415),
    ("lora", kernels.section_lora, 440),
    ("moe", kernels.section_moe, 465),
    ("tuning", section_tuning, DEFAULT_BUDGET_S),
)
SECTION_NAMES = tuple(name for name, _, _ in SECTIONS)


def run_sections(profile: Profile, interpret: bool, budget_s: float, out_dir: str, only=None) -> dict:
    """Run the sections in order (only: those named, and the environment); each one's result is printed and
    appended to gpu_check.jsonl as it ends."""
    hard_end, state, results = START + budget_s, {}, {}
    jsonl = os.path.join(out_dir, "gpu_check.jsonl")
    open(jsonl, "w").close()
    for name, run, end in SECTIONS:
        if only is not None and name not in only and name != "environment":
            continue
        log(f"section {name} ({hard_end - time.time():.0f} s of the budget left)")
        ctx = Section(name, profile, interpret, START + end / DEFAULT_BUDGET_S * budget_s, hard_end, state)
        section_start = time.perf_counter()
        result = {"status": "ok"}
        try:
            with SIGTERM.interruptible():
                run(ctx)
        except Terminated:
            result = {"status": "terminated", "error": "SIGTERM during this section"}
        except Exception:  # noqa: BLE001 - one failing section must not stop the others
            result = {"status": "error", "error": traceback.format_exc()}
            log(f"section {name} FAILED:\n{result['error']}")
        results[name] = {**result, "seconds": time.perf_counter() - section_start,
                         "elapsed_s": time.time() - START, "rows": ctx.rows}
        emit(name, results[name], jsonl)
        if SIGTERM.requested:
            break
    return results


def emit(name: str, result: dict, jsonl: str) -> None:
    """The section's one JSON line: appended to the jsonl file (closed at once: in the OS's hands even if the
    process is killed next), then printed."""
    line = json.dumps({"section": name, **result}, default=str)
    with open(jsonl, "a") as f:
        f.write(line + "\n")
    print(f"GPU_CHECK_JSON {line}", flush=True)


def summary_table(results: dict) -> str:
    """One aligned table per section."""
    lines = []
    for name, section in results.items():
        lines.append(f"== {name}: {section['status']} ({section['seconds']:.0f} s, at {section['elapsed_s']:.0f} s)")
        rows = section["rows"]
        if not rows:
            continue
        keys = list(dict.fromkeys(key for row in rows for key in row))
        cells = [keys] + [[fmt(row.get(key, "")) for key in keys] for row in rows]
        widths = [max(len(line[i]) for line in cells) for i in range(len(keys))]
        lines += ["   " + "  ".join(cell.ljust(width) for cell, width in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-smoke", "--dry-run", action="store_true",
                        help="tiny shapes in interpret mode on the CPU: exercises everything but the GPU")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="seconds from the process's start after which no measurement starts")
    parser.add_argument("--xla-defaults", action="store_true",
                        help="leave XLA's compile options as they are (no FAST_COMPILE_XLA_FLAGS)")
    parser.add_argument("--sections", type=lambda text: text.split(","), default=None,
                        help="comma-separated sections to run (the environment always runs), e.g. a rerun of "
                             f"the ones a first run did not reach; default: all of {', '.join(SECTION_NAMES)}")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.sections or ()) - set(SECTION_NAMES))
    if unknown:
        parser.error(f"unknown sections {unknown}; known: {', '.join(SECTION_NAMES)}")
    if args.cpu_smoke:
        jax.config.update("jax_platforms", "cpu")
    elif jax.default_backend() != "gpu":
        parser.error(f"no GPU (default backend {jax.default_backend()!r}); use --cpu-smoke")
    profile, interpret = (SMOKE, True) if args.cpu_smoke else (GPU, False)
    out_dir = os.environ.get("OUT", "gpu_check_out")
    os.makedirs(out_dir, exist_ok=True)
    SIGTERM.install()  # from here a SIGTERM stops the run, but only once what was measured is written
    results = run_sections(profile, interpret, args.budget_s, out_dir, args.sections)
    with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(summary_table(results), flush=True)
    failed = [name for name, s in results.items() if s["status"] != "ok"]
    failed += [f"{name}: {row}" for name, s in results.items() for row in s["rows"]
               if "error" in row or row.get("ok") is False]
    failed += ["stopped by SIGTERM before the last section"] if SIGTERM.requested else []
    log(f"wrote {out_dir}/gpu_check.json and gpu_check.jsonl in {time.time() - START:.0f} s; "
        + (f"FAILED: {failed}" if failed else "all sections ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
