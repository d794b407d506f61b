"""Run in a subprocess with 4 fake CPU devices: the LoRA engine at tensor_parallel_size N against the unsharded
LoRA engine, greedy, on a mix of the base model and several adapters swapping through two slots. Prints one JSON
object {"tpN": {"equal": bool, "tokens": {...}}}.

    python -m tests.lora.tp_lora_worker MODEL_DIR ADAPTER_DIR [ADAPTER_DIR ...] --sizes 2,4
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import argparse  # noqa: E402
import json  # noqa: E402

from jaxllm import LLM, LoRARequest, SamplingParams  # noqa: E402


def run(model: str, adapters: list[str], tp_size: int | None) -> list[list[int]]:
    llm = LLM(model, tensor_parallel_size=tp_size, enable_lora=True, max_loras=2, max_lora_rank=8,
              skip_tokenizer=True, max_model_len=64, max_num_seqs=4, max_num_batched_tokens=32)
    loras = [None] + [LoRARequest(f"a{i}", i + 1, path) for i, path in enumerate(adapters)]
    prompts = [{"prompt_token_ids": [3 + i, 40 + 7 * i, 11, 200 - i] * (1 + i % 3)} for i in range(2 * len(loras))]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
    outputs = llm.generate(prompts, params, use_tqdm=False,
                           lora_request=[loras[i % len(loras)] for i in range(len(prompts))])
    return [o.outputs[0].token_ids for o in outputs]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("adapters", nargs="+")
    parser.add_argument("--sizes", default="2,4")
    args = parser.parse_args()
    want = run(args.model, args.adapters, None)
    report = {}
    for n in map(int, args.sizes.split(",")):
        got = run(args.model, args.adapters, n)
        report[f"tp{n}"] = {"equal": got == want, "tokens": got}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
