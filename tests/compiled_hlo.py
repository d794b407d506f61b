"""Reading an optimized HLO module (`compiled.as_text()`, or XLA's after-optimizations dump): which instructions
write new arrays, and how many bytes the program's kernels move. Used on the CPU programs (tests/model) and on the
deviceless H200 compiles (tests/gpu_compile) alike.
"""

from __future__ import annotations

import re

HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
             "s64": 8, "u64": 8, "f64": 8}


def array_bytes(hlo_type: str, dims: str) -> int:
    size = HLO_BYTES.get(hlo_type, 4)
    for v in dims.split(","):
        if v:
            size *= int(v)
    return size


_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[([\d,]*)\]\S* ([\w\-]+)\(")
_NOT_A_COPY = {"parameter", "bitcast", "get-tuple-element", "tuple", "constant", "while", "conditional",
               "custom-call", "copy-done"}


def computations(hlo: str) -> dict[str, list[str]]:
    """The optimized HLO's computations: name -> instruction lines."""
    found, name = {}, None
    for line in hlo.splitlines():
        if name is None:
            if m := _COMPUTATION.match(line):
                name = m.group(1)
                found[name] = []
        elif line.strip() == "}":
            name = None
        else:
            found[name].append(line)
    return found


def materialized(hlo: str, dims: set[tuple[int, ...]]) -> list[str]:
    """Instructions that write a new array of one of the shapes `dims` (leading 1s ignored) into memory: the
    unfused instructions of the program (a fusion counts as one, whatever it computes inside), excluding
    parameters, bitcasts, tuples and custom calls (the kernels' own outputs). A weight the program reads where it
    lies appears in none; a weight sliced out of a stack, copied or converted before its GEMM does."""
    comps = computations(hlo)
    fused = set(re.findall(r"calls=%([\w.\-]+)", hlo)) | set(re.findall(r"to_apply=%([\w.\-]+)", hlo))
    found = []
    for name, lines in comps.items():
        if name in fused:
            continue
        for line in lines:
            m = _INSTRUCTION.match(line)
            if not m or m.group(4) in _NOT_A_COPY:
                continue
            shape = tuple(int(v) for v in m.group(3).split(",") if v)
            while shape[:1] == (1,):
                shape = shape[1:]
            if shape in dims:
                found.append(f"{m.group(4)} {m.group(2)}[{m.group(3)}] %{m.group(1)} in {name}")
    return found


_DEFINITION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\([^=]*?\)|\w+\[[\d,]*\])\S* ([\w\-]+)\((.*?)\)")
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")
_NO_TRAFFIC = {"parameter", "bitcast", "get-tuple-element", "tuple", "constant", "while", "conditional", "call",
               "copy-done", "all-reduce-done", "all-gather-done", "async-done", "partition-id", "replica-id",
               "after-all", "opt-barrier"}


def kernel_traffic(hlo: str, indexed: set[tuple[int, ...]]) -> int:
    """Bytes the program's kernels move, counted from the optimized HLO: every unfused instruction that runs on
    the device (a fusion, a custom call, a copy, a collective) reads its operands and writes its result, whole.
    Arrays of the shapes `indexed` (the KV pool, the embedding table) are only partly read or written by the
    kernels that take them, so they are left out and the caller adds what is really read of them. A loop body
    counts once (traffic_by_computation tells the computations apart)."""
    return sum(traffic_by_computation(hlo, indexed).values())


def traffic_by_computation(hlo: str, indexed: set[tuple[int, ...]]) -> dict[str, int]:
    """kernel_traffic of each unfused computation (the entry, loop bodies and conditions, ...)."""
    comps = computations(hlo)
    fused = set(re.findall(r"calls=%([\w.\-]+)", hlo)) | set(re.findall(r"to_apply=%([\w.\-]+)", hlo))
    sizes: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    launches = []
    for name, lines in comps.items():
        for line in lines:
            if not (m := _DEFINITION.match(line)):
                continue
            arrays = [(t, tuple(int(v) for v in d.split(",") if v)) for t, d in _ARRAY.findall(m.group(2))]
            sizes[m.group(1)] = arrays
            if name not in fused and m.group(3) not in _NO_TRAFFIC:
                launches.append((name, m.group(1), re.findall(r"%([\w.\-]+)", m.group(4))))

    def moved(name: str) -> int:
        total = 0
        for hlo_type, shape in sizes.get(name, []):
            trimmed = shape
            while trimmed[:1] == (1,):
                trimmed = trimmed[1:]
            if trimmed not in indexed:
                total += array_bytes(hlo_type, ",".join(map(str, shape)))
        return total

    traffic: dict[str, int] = {}
    for computation, result, operands in launches:
        traffic[computation] = traffic.get(computation, 0) + moved(result) + sum(map(moved, operands))
    return traffic
