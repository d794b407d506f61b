"""Where a jitted forward's device time goes, by XLA operation kind: a jax.profiler trace of the default model's
step (the layers and the LM head, the weights stored as the engine's runner stores them: on a CPU with AMX or
AVX512-BF16 the head and the layers' linears as AMX tiles), its events summed by name with the instance numbers
dropped; a native call is named by its FFI target and, for a dot, the weight it reads (from the compiled program's
text).

    cd benchmarks && python forward_ops.py --batch 64 --new-tokens 1 --context 192   # a decode step
    cd benchmarks && python forward_ops.py --batch 4 --new-tokens 128 --context 0    # a 512-token prefill

Kinds on CPU: ynn_fusion (XLA's dots, YNNPACK), ffi_call:TARGET (the native kernels: attention, K/V write, skinny,
argmax and, over tiles, the tiled matmul; ffi_call:jaxllm_tiled_matmul:w_qkv is the tiled kernel's dot with a
layer's q|k|v weight), *_fusion (XLA's elementwise loops), psum (all-reduces), copy. The pool is not donated here,
so a `copy` of the whole K/V pool (two a step) belongs to this benchmark, not to the engine's program, which donates
it.
"""

from __future__ import annotations

import argparse
import collections
import re
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
from core_forward import BLOCK_SIZE
from skinny_forward import step_program

from jaxllm.loaders import load_model
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, select_kernels
from jaxllm.model.tiled_params import tile_params


def step_inputs(config, batch: int, new_tokens: int, context: int, dtype):
    """A pool and a step of `batch` sequences, `new_tokens` each after `context` cached, logits of the last."""
    per_seq = -(-(context + new_tokens) // BLOCK_SIZE)
    kv = init_kv_cache(config, 1 + batch * per_seq, BLOCK_SIZE, dtype)
    chunks = [SequenceChunk(list(range(7 + s, 7 + s + new_tokens)), context,
                            list(range(1 + s * per_seq, 1 + (s + 1) * per_seq))) for s in range(batch)]
    return kv, build_step_batch(chunks, BLOCK_SIZE)


def native_call_names(program_text: str) -> dict[str, str]:
    """A compiled program's custom-call instructions (e.g. "ffi_call.427") -> "ffi_call:TARGET", with ":FIELD"
    added when an operand is a weight parameter (params_layers_0__w_qkv_tiles -> w_qkv, params_embed_tiles ->
    embed)."""
    names = {}
    for line in program_text.splitlines():
        call = re.match(r"\s*(?:ROOT )?%?([\w.-]+) = .*custom_call_target=\"([^\"]+)\"", line)
        if call:
            weight = re.search(r"%params_(?:layers_\d+__)?([a-z_]+?)(?:_tiles)?(?:\.\d+)?[,)]", line)
            names[call.group(1)] = f"ffi_call:{call.group(2)}" + (f":{weight.group(1)}" if weight else "")
    return names


def op_times(trace_dir: Path, calls: int, names: dict[str, str]) -> dict[str, tuple[float, int]]:
    """kind -> (ms a call of the step, events a call) from the trace's device-side events; `names`: an event's
    kind by its name where native_call_names gives one."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(str(next(trace_dir.rglob("*.xplane.pb"))))
    totals = collections.defaultdict(lambda: [0.0, 0])
    for plane in data.planes:
        for line in plane.lines:
            if line.name == "python":
                continue
            for event in line.events:
                if event.name.startswith(("ThunkExecutor", "end:")):
                    continue
                kind = names.get(event.name) or re.sub(r"\.\d+", "", event.name)
                totals[kind][0] += event.duration_ns / 1e6 / calls
                totals[kind][1] += 1
    return {kind: (ms, count // calls) for kind, (ms, count) in totals.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=1)
    parser.add_argument("--context", type=int, default=192)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()

    kernels = select_kernels()
    loaded = load_model(dtype=args.dtype)
    params = tile_params(loaded.params, kernels, num_devices=1)  # stored as the engine's runner stores them
    kv, batch = step_inputs(loaded.config, args.batch, args.new_tokens, args.context, jnp.dtype(args.dtype))
    step = step_program(loaded.config, kernels, kernels).lower(params, kv, batch).compile()  # run and read once
    names = native_call_names(step.as_text())
    for _ in range(3):
        jax.block_until_ready(step(params, kv, batch))
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for _ in range(args.calls):
                jax.block_until_ready(step(params, kv, batch))
        times = op_times(Path(trace_dir), args.calls, names)
    print(f"{args.batch} x {args.new_tokens} new tokens after {args.context}, {args.dtype}, {kernels}\n")
    print("| kind | ms a step | events a step |\n|---|---:|---:|")
    for kind, (ms, count) in sorted(times.items(), key=lambda item: -item[1][0])[:args.top]:
        print(f"| {kind} | {ms:.2f} | {count} |")


if __name__ == "__main__":
    main()
