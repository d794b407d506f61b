"""N-gram speculative decoding against plain decoding, side by side in one run: single stream on the default
model, k = 4 proposals, on a repetitive workload (the model asked to repeat a given text, greedy, ending where the
model ends its copy: EOS respected, --max-tokens a cap), on random
token-id prompts decoded greedily (where the small model tends to fall into loops, which proposals match) and on
random prompts sampled at temperature 1 with seeds (where proposals rarely match). Requests alternate between the two engines, so both see the same
machine load.

    python benchmarks/spec_decode.py [--max-tokens 96] [--num-prompts 5] [--k 4] [--draft-self]

--draft-self adds a third engine whose draft model is the default model itself: a correctness and overhead
measurement (every greedy proposal is accepted, and each step runs the same model k more times), not a speedup.

Decode tokens/s per engine: tokens after the first over the time from the first token to the last, summed over
the requests; also each workload's acceptance (accepted / proposed tokens) and the ratio of the two rates.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from jaxllm.llm import LLM
from jaxllm.loaders import resolve_model
from jaxllm.sampling_params import SamplingParams

TEXTS = [
    "The quick brown fox jumps over the lazy dog. The dog does not move, and the fox runs into the forest, where "
    "it finds a small river and drinks from it before the sun goes down.",
    "To install the package, run pip install jaxllm, then start the server with jaxllm serve and send requests to "
    "the completions endpoint. Each request names the model, the prompt and the number of tokens to generate.",
    "def add(a, b):\n    return a + b\n\n\ndef multiply(a, b):\n    return a * b\n\n\nprint(add(2, 3), "
    "multiply(4, 5))\n",
    "The library keeps a pool of key and value blocks for every layer. When a request arrives, the scheduler gives "
    "it blocks for its prompt; when it finishes, its blocks go back to the pool. Blocks that hold the same prompt "
    "prefix are shared between requests, so a second request with the same system prompt computes only its own "
    "question.",
    "Monday: buy milk, eggs and bread. Tuesday: call the bank about the new card. Wednesday: send the report to the "
    "team before noon. Thursday: book the train for the weekend. Friday: water the plants and take out the trash.",
]


def decode_rate(outputs) -> tuple[int, float]:
    """(tokens after the first, seconds from the first token to the last), summed."""
    tokens = sum(len(o.outputs[0].token_ids) - 1 for o in outputs)
    seconds = sum(o.metrics.finished_time - o.metrics.first_token_time for o in outputs)
    return tokens, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--num-prompts", type=int, default=5)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--draft-self", action="store_true", help="also the default model as its own draft")
    args = parser.parse_args()
    common = dict(max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=256, disable_log_stats=True, warmup=True)
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    engines = {"plain": LLM(**common), "ngram": LLM(**common, speculative_config=spec)}
    if args.draft_self:
        draft = {"model": str(resolve_model(None).path), "num_speculative_tokens": args.k}
        engines["draft-self"] = LLM(**common, speculative_config=draft)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    copy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)  # a copy ends where the model ends it
    rng = np.random.RandomState(0)
    workloads = {
        "repetitive": [[{"role": "user", "content": f"Repeat this text exactly, word for word:\n\n{text}"}]
                       for text in TEXTS[:args.num_prompts]],
        "random": [{"prompt_token_ids": rng.randint(100, 49000, size=64).tolist()} for _ in range(args.num_prompts)],
    }
    workloads["random-sampled"] = workloads["random"]
    sampled = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.max_tokens, ignore_eos=True)
               for i in range(args.num_prompts)]
    for llm in engines.values():  # warm-up built every program; one request each first (not timed)
        llm.chat(workloads["repetitive"][:1], SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
        llm.generate(workloads["random"][:1], SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
    report = {}
    for name, prompts in workloads.items():
        totals = {engine: [0, 0.0] for engine in engines}
        lengths = {engine: [] for engine in engines}
        before = {engine: llm.engine.stats() for engine, llm in engines.items()}
        for i, prompt in enumerate(prompts):
            for engine, llm in engines.items():
                run = llm.chat if name == "repetitive" else llm.generate
                params = {"repetitive": copy, "random": greedy, "random-sampled": sampled[i]}[name]
                outputs = run([prompt], params, use_tqdm=False)
                lengths[engine].append(len(outputs[0].outputs[0].token_ids))
                tokens, seconds = decode_rate(outputs)
                totals[engine][0] += tokens
                totals[engine][1] += seconds
        rates = {engine: tokens / seconds for engine, (tokens, seconds) in totals.items()}
        report[name] = {"decode_tok_s": {e: round(r, 1) for e, r in rates.items()},
                        "output_tokens": lengths["plain"]}
        for engine in engines.keys() - {"plain"}:
            after = engines[engine].engine.stats()
            proposed, accepted = (after[key] - before[engine][key] for key in ("spec_decode_num_draft_tokens",
                                                                               "spec_decode_num_accepted_tokens"))
            report[name][engine] = {"speedup": round(rates[engine] / rates["plain"], 2),
                                    "acceptance": round(accepted / proposed, 3) if proposed else None,
                                    "proposed": proposed, "accepted": accepted}
        print(name, json.dumps(report[name]), flush=True)
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **report}))


if __name__ == "__main__":
    main()
