"""One of several processes running one model with jax.distributed (CPU devices, gloo collectives): the offline
LLM API on a tiny model, every process given the same prompts (SPMD). Prints one JSON object: {"process": index,
"devices": global device count, "tokens": {prompt index: token ids}}.

    python -m tests.engine.multihost_worker MODEL_DIR --devices-per-process D [--num-processes P --process-id I
        --coordinator-address HOST:PORT]   (or the JAXLLM_* environment variables)
"""

from __future__ import annotations

import argparse
import json
import os


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--devices-per-process", type=int, default=1)
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--coordinator-address")
    return parser.parse_args()


def main() -> None:
    args = parse()
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={args.devices_per_process}")
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    from jaxllm.llm import LLM
    from tests.engine.multihost_cases import ENGINE_ARGS, prompts, sampling_params

    llm = LLM(args.model, num_processes=args.num_processes, process_id=args.process_id,
              coordinator_address=args.coordinator_address, **ENGINE_ARGS)
    outputs = llm.generate(prompts(), sampling_params(), use_tqdm=False)
    tokens = {i: output.outputs[0].token_ids for i, output in enumerate(outputs)}
    print(json.dumps({"process": jax.process_index(), "devices": jax.device_count(), "tokens": tokens}), flush=True)


if __name__ == "__main__":
    main()
