"""Online serving benchmark against a running `jaxllm serve` (or any OpenAI-compatible server), as
`vllm bench serve`; the same as `jaxllm bench serve` and with the same flags. The implementation lives in
jaxllm/benchmarks/serving.py; see its docstring for the metrics.

    jaxllm serve --port 8000 --max-num-seqs 16 --max-model-len 512 &
    python benchmarks/serving.py --num-prompts 64 --input-len 128 --output-len 64 --request-rate 4 \
        --max-concurrency 16 --num-warmup 16 --output-json serving.json

Needs httpx (`pip install httpx`; the `test` extra installs it).
"""

import sys

from jaxllm.benchmarks.serving import main

if __name__ == "__main__":
    sys.exit(main())
