"""The dtype `dtype="auto"` picks on a CPU: the one whose matmuls are the faster ones on this machine's CPU.

Chosen by the CPU's flags (/proc/cpuinfo), from measurements (benchmarks/RESULTS.md):
    amx_bf16      bfloat16  XLA:CPU's bfloat16 dots run on AMX tiles: the engine ~1.9x float32
    avx512_bf16   bfloat16  without AMX, the tiled matmul on VDPBF16PS (Zen 5): batch 64 2.1-2.3x float32,
                            mixed 2.3-2.4x, batch-1 decode 1.5-1.6x (Zen 4, before that kernel: 1.3x, 1.09x, even)
    otherwise     float32   AVX2 alone: bfloat16 dots are several times slower than float32
JAXLLM_CPU_FLAGS, where set, stands in for the CPU's flags (space-separated; the test suite pins float32 with it).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

CPUINFO = Path("/proc/cpuinfo")
FLAGS_ENV = "JAXLLM_CPU_FLAGS"
FAST_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # any of these: bfloat16 is the faster dtype


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first processor's flags in `cpuinfo`; empty where the file is missing or has no flags line."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def machine_flags() -> frozenset[str]:
    """$JAXLLM_CPU_FLAGS's flags where it is set, else this machine's (cpu_flags)."""
    env = os.environ.get(FLAGS_ENV)
    return frozenset(env.split()) if env is not None else cpu_flags()


def cpu_auto_dtype(flags: frozenset[str] | None = None) -> str:
    """"bfloat16" where the CPU (machine_flags() if None) has a flag of FAST_BF16_FLAGS, else "float32"; logs the
    choice and why."""
    flags = machine_flags() if flags is None else flags
    found = [f for f in FAST_BF16_FLAGS if f in flags]
    dtype = "bfloat16" if found else "float32"
    why = f"the CPU has {', '.join(found)}" if found else f"the CPU has none of {', '.join(FAST_BF16_FLAGS)}"
    logger.info("dtype auto on CPU: %s (%s)", dtype, why)
    return dtype
