"""Bytes a multi-host leader would broadcast per step if followers ran only the runner on its SchedulerOutput,
against the adds it broadcasts today (followers run the whole engine).

    python benchmarks/scheduler_output_size.py [--batch 256] [--context 2000] [--steps 20]

A scheduler alone (no model): --batch requests of --context random prompt tokens are admitted and prefilled,
then every sequence decodes. Reported: the pickled SchedulerOutput of the admission steps and of a decode step
(median), and the pickled adds of the same requests (id, prompt token ids, sampling parameters), which today's
leader broadcasts once per request.
"""

from __future__ import annotations

import argparse
import pickle
import statistics

import numpy as np

from jaxllm.config import SchedulerConfig
from jaxllm.engine.block_pool import BlockPool
from jaxllm.engine.kv_cache_manager import KVCacheManager
from jaxllm.engine.request import Request
from jaxllm.engine.scheduler import Scheduler
from jaxllm.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    max_tokens = args.batch * args.context // 4096 + args.steps + 16  # no request ends before all decode
    max_len = args.context + max_tokens
    blocks_per_seq = -(-max_len // args.block_size)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=args.batch, max_num_batched_tokens=4096, max_model_len=max_len),
                          KVCacheManager(BlockPool(1 + args.batch * blocks_per_seq), args.block_size))
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, repetition_penalty=1.1)
    adds = []
    for i in range(args.batch):
        prompt = rng.integers(0, 49152, size=args.context).tolist()
        scheduler.add_request(Request(str(i), prompt, params))
        adds.append((str(i), prompt, params))
    admission, decode = 0, []
    while True:
        out = scheduler.schedule()
        assert out.chunks, "every request ended before all of them decoded together"
        size = len(pickle.dumps(out))
        if all(c.num_new_tokens == 1 for c in out.chunks) and len(out.chunks) == args.batch:
            decode.append(size)
            if len(decode) == args.steps:
                break
        else:
            admission += size
        scheduler.update(out, {c.request_id: 7 for c in out.chunks if c.samples})
    print(f"batch {args.batch}, prompts of {args.context} tokens: adds {len(pickle.dumps(adds)) / 1e6:.2f} MB once; "
          f"SchedulerOutputs of the admission steps {admission / 1e6:.2f} MB; a decode step's SchedulerOutput "
          f"{statistics.median(decode) / 1e3:.1f} kB (median of {len(decode)}), today's broadcast then: no adds")


if __name__ == "__main__":
    main()
