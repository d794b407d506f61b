"""jaxllm vs Hugging Face transformers on the same prompts, side by side in one run (CPU).

    python benchmarks/compare_hf.py --workload fixed      # 64 prompts of ~32 tokens, 128 new tokens, EOS ignored
    python benchmarks/compare_hf.py --workload mixed      # 128 prompts, 16-256 prompt and output tokens (seed 0)

HF runs static batches (left padding, greedy, `min_new_tokens` = `max_new_tokens` so EOS is ignored); in the mixed
workload each static batch generates up to its longest request's output length, and only each request's own
tokens count as useful output. jaxllm runs `LLM.generate` once on other prompts of the same lengths (compiling;
reported separately) and then on the workload, measured.
Output tokens/s counts useful generated tokens over wall time.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import numpy as np

from jaxllm.benchmarks.datasets import mixed_lengths
from jaxllm.llm import LLM
from jaxllm.model.kernels import resolve_attention
from jaxllm.model.params import params_dtype
from jaxllm.sampling_params import SamplingParams

WORDS = ("the quick brown fox jumps over lazy dog river mountain city story science music history ocean "
         "garden machine learning language model winter summer bright dark ancient future").split()


def make_workload(name: str, tokenizer, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) per request."""
    rng = np.random.RandomState(seed)
    if name == "fixed":
        lengths = [(32, 128)] * 64
    else:
        lengths = mixed_lengths(rng)
    return word_prompts(tokenizer, lengths, rng)


def word_prompts(tokenizer, lengths, rng) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) per (prompt length, output length): prompts of random WORDS."""
    requests = []
    for prompt_len, output_len in lengths:
        ids: list[int] = []
        while len(ids) < prompt_len:
            ids += tokenizer.encode(" ".join(rng.choice(WORDS, size=16)))
        requests.append((ids[:prompt_len], int(output_len)))
    return requests


def generate_greedy(llm: LLM, requests) -> tuple[float, int]:
    """(seconds, output tokens) of one LLM.generate over the requests: greedy, EOS ignored, no detokenizing."""
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False) for _, n in requests]
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p, _ in requests], params, use_tqdm=False)
    return time.perf_counter() - start, sum(len(o.outputs[0].token_ids) for o in outputs)


def run_jaxllm(llm: LLM, warmup_requests, requests) -> dict:
    """A warm-up run on other prompts of the same shapes (so the prefix cache cannot help), then the timed run."""
    compile_s = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **_: compile_s.append(secs) if "backend_compile" in event else None)

    first, _ = generate_greedy(llm, warmup_requests)
    compiled_first, compile_first = llm.engine.runner.num_compiled_programs, sum(compile_s)
    elapsed, tokens = generate_greedy(llm, requests)
    return {"engine": "jaxllm", "output_tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed,
            "warmup_run_seconds": first, "programs_compiled_in_warmup": compiled_first,
            "compile_seconds_in_warmup": compile_first, "programs_total": llm.engine.runner.num_compiled_programs,
            "compile_seconds_total": sum(compile_s), "programs_used": len(llm.engine.runner.programs_used)}


def run_hf(model, requests, batch_size: int, dtype) -> dict:
    import torch

    model = model.to(dtype)
    useful = 0
    start = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        batch = requests[i:i + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        new = max(n for _, n in batch)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0)
        useful += sum(n for _, n in batch)
    elapsed = time.perf_counter() - start
    return {"engine": f"hf-{str(dtype).replace('torch.', '')}-b{batch_size}", "output_tokens": useful,
            "seconds": elapsed, "tokens_per_s": useful / elapsed}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["fixed", "mixed"], default="fixed")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--hf-batch-sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--hf-dtypes", nargs="*", default=["float32", "bfloat16"], help="none: jaxllm alone")
    parser.add_argument("--attention", default="auto", help="jaxllm's attention backend (EngineArgs.attention)")
    parser.add_argument("--dtype", default="auto", help="jaxllm's weight and KV dtype (EngineArgs.dtype)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (jax uses all cores)")
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()

    llm = LLM(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=1024,
              attention=args.attention, dtype=args.dtype)
    requests = make_workload(args.workload, llm.get_tokenizer())
    print(f"workload {args.workload}: {len(requests)} requests, {sum(len(p) for p, _ in requests)} prompt tokens, "
          f"{sum(n for _, n in requests)} output tokens; jax {jax.__version__}, {platform.machine()}, attention "
          f"{resolve_attention(args.attention)}, dtype {params_dtype(llm.engine.runner.params)}", flush=True)
    results = [run_jaxllm(llm, make_workload(args.workload, llm.get_tokenizer(), seed=1), requests)]
    print(results[-1], flush=True)
    path = llm.engine.loaded.source.path
    if args.hf_dtypes:  # torch and transformers only when HF runs
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(args.threads)
        print(f"torch {torch.__version__}", flush=True)
        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    for dtype in args.hf_dtypes:
        for batch_size in args.hf_batch_sizes:
            results.append(run_hf(hf, requests, batch_size, getattr(torch, dtype)))
            print(results[-1], flush=True)
    hf_results = [r for r in results if r["engine"].startswith("hf")]
    print("\n| engine | output tok/s | seconds |\n|---|---:|---:|")
    for r in results:
        print(f"| {r['engine']} | {r['tokens_per_s']:.1f} | {r['seconds']:.1f} |")
    if hf_results:
        best_hf = max(hf_results, key=lambda r: r["tokens_per_s"])
        print(f"\njaxllm / best HF ({best_hf['engine']}): {results[0]['tokens_per_s'] / best_hf['tokens_per_s']:.2f}x")
    print(f"jaxllm compiled {results[0]['programs_total']} programs in {results[0]['compile_seconds_total']:.1f}s "
          f"({results[0]['programs_compiled_in_warmup']} during the warm-up run)")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"workload": args.workload, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
