"""Offline throughput, as `vllm bench throughput`; the same as `jaxllm bench throughput` and with the same flags.
The implementation lives in jaxllm/benchmarks/throughput.py; see its docstring for what is measured.

    python benchmarks/throughput.py --num-prompts 64 --input-len 128 --output-len 128         # the default model
    python benchmarks/throughput.py --model path/to/model --random-range-ratio 0.5
    python benchmarks/throughput.py --random-weights --config llama3-8b --dtype bfloat16      # no weights needed
"""

import sys

from jaxllm.benchmarks.throughput import main

if __name__ == "__main__":
    sys.exit(main())
