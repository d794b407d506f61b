"""Compile for an NVIDIA H200 (sm_90a) on a machine that has no GPU, and read what the compiler says.

jax 0.11.2 with the CUDA 13 plugin builds a compile-only "cuda" topology from a GpuTargetConfigProto
(`jax.experimental.topologies.get_topology_desc(..., target_config=...)`); jitting with shardings on its mesh and
calling `.lower().compile()` then runs XLA's whole GPU pipeline without a device: the plugin's own Triton compiles
the Pallas kernels, ptxas turns the PTX into sm_90a cubins. Nothing executes, so nothing here is a timing.

What a compile reports (CompileReport):
    kernels     every launch of the program (XLA's thunk sequence: grid, threads, dynamic shared memory) with
                ptxas's registers, spills and stack for its entry, read through a ptxas wrapper that keeps each
                PTX file and asks the real ptxas for -v
    hlo         the optimized HLO text (what XLA copies, converts or aliases)
    cost        XLA's cost analysis of the compiled module ("bytes accessed", "flops")
    memory      XLA's memory analysis (arguments, outputs, aliased and temporary bytes)

XLA's own GEMMs are not autotuned without a device (they get a default Triton tiling), so their kernels are not
the ones a real H200 would pick; the Pallas kernels are compiled exactly as on the device.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import tempfile
import time

# The fields of an H200's GpuTargetConfigProto that the compile reads (from the device's published limits:
# 132 SMs, 228 KiB shared memory per SM of which 227 KiB per block, 64K registers per SM, 4.8 TB/s HBM3e).
H200_TARGET_CONFIG = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 4800000000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 151397597184
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 patch: 0 }
device_description_str: "NVIDIA H200 141GB HBM3e"
"""


@dataclasses.dataclass(frozen=True)
class SM90Limits:
    registers_per_thread: int = 255
    registers_per_sm: int = 65536
    shared_memory_per_block: int = 232448  # 227 KiB, with the opt-in
    shared_memory_per_sm: int = 233472
    threads_per_sm: int = 2048
    blocks_per_sm: int = 32


SM90 = SM90Limits()

# ptxas stand-in: keep the PTX and the real ptxas's -v report, then do what ptxas does.
_PTXAS_WRAPPER = """#!/bin/bash
if [ "$1" = "--version" ]; then exec "{real}" "$@"; fi
stamp="{capture}/$(date +%s%N)-$$"
[ -f "$1" ] && cp "$1" "$stamp.ptx"
"{real}" -v "$@" 2> "$stamp.stderr"
status=$?
cat "$stamp.stderr" >&2
exit $status
"""

_LAUNCH = re.compile(r"(?:kCustomKernel|kKernel)\s+(?:\[[^\]]*\]\s+)?(\S+)\s+grid:\s*\[([^\]]*)\]\s+"
                     r"threads:\s*\[([^\]]*)\]\s+shared_memory:\s*(\d+)")
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")


@dataclasses.dataclass
class Kernel:
    """One launch of the program and ptxas's account of its entry."""
    name: str
    grid: tuple[int, ...]
    threads: int  # per block
    shared_memory: int  # bytes of dynamic shared memory per block
    registers: int | None = None  # per thread
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack: int | None = None
    ptx: str | None = None  # the PTX file this entry came from

    def blocks_per_sm(self, limits: SM90Limits = SM90) -> int:
        """Resident blocks per SM: registers (allocated per warp in units of 256), shared memory (1 KiB reserved
        per block), threads and the hardware cap."""
        warps = -(-self.threads // 32)
        registers_per_warp = -(-max(self.registers or 1, 1) * 32 // 256) * 256
        by_registers = limits.registers_per_sm // (registers_per_warp * warps)
        by_smem = limits.shared_memory_per_sm // (self.shared_memory + 1024) if self.shared_memory else 10 ** 9
        return min(by_registers, by_smem, limits.threads_per_sm // self.threads, limits.blocks_per_sm)

    def problems(self, limits: SM90Limits = SM90) -> list[str]:
        """What keeps this kernel from running well (or at all) on sm_90: empty when it fits."""
        found = []
        if self.registers is None:
            found.append("no ptxas report")
        elif self.registers > limits.registers_per_thread:
            found.append(f"{self.registers} registers per thread")
        if self.spill_stores or self.spill_loads:
            found.append(f"spills {self.spill_stores} B stored / {self.spill_loads} B loaded")
        if self.shared_memory > limits.shared_memory_per_block:
            found.append(f"{self.shared_memory} B of shared memory per block")
        if self.registers is not None and self.blocks_per_sm(limits) < 1:
            found.append("not one block fits on an SM")
        return found

    def ptx_body(self) -> str:
        """The PTX text of this kernel's entry alone."""
        if not self.ptx:
            return ""
        text = open(self.ptx).read()
        start = text.find(f".entry {self.name}(")
        if start < 0:
            return ""
        end = text.find(".entry ", start + 8)
        return text[start:] if end < 0 else text[start:end]


@dataclasses.dataclass
class CompileReport:
    seconds: float
    kernels: list[Kernel]
    hlo: str
    cost: dict
    memory: object  # CompiledMemoryStats

    def kernels_named(self, prefix: str) -> list[Kernel]:
        return [k for k in self.kernels if k.name.split("__")[0].startswith(prefix)]

    @property
    def bytes_accessed(self) -> float:
        return float(self.cost.get("bytes accessed", 0.0))


def find_ptxas() -> str | None:
    """ptxas of the nvidia-cuda-nvcc wheel (nvidia/cu13/bin), else the one on PATH."""
    try:
        import nvidia

        for root in nvidia.__path__:
            for path in sorted(glob.glob(os.path.join(root, "cu1*", "bin", "ptxas"))):
                return os.path.realpath(path)
    except ImportError:
        pass
    found = shutil.which("ptxas")
    return os.path.realpath(found) if found else None


def unavailable_reason() -> str | None:
    """Why a deviceless H200 compile cannot run in this environment, or None when it can."""
    try:
        import jax
        import jax_plugins.xla_cuda13  # noqa: F401  (the CUDA 13 plugin)
    except ImportError as e:
        return f"the CUDA 13 plugin is not installed ({e})"
    if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11):
        return f"jax {jax.__version__}: the deviceless compile needs jax 0.11"
    if find_ptxas() is None:
        return "no ptxas (pip install nvidia-cuda-nvcc)"
    return None


class DevicelessH200:
    """Compile-only H200 devices (a mesh of `num_devices` along one axis "tp") and a compile that reports."""

    def __init__(self, work_dir: str, num_devices: int = 1):
        import jax
        from jax.experimental import topologies

        self.work_dir = work_dir
        topology = topologies.get_topology_desc("h200", "cuda", target_config=H200_TARGET_CONFIG,
                                                topology=f"1x1x{num_devices}")  # one host
        self.mesh = topologies.make_mesh(topology, (num_devices,), ("tp",))
        self.devices = topology.devices
        self._cuda_dir = self._fake_cuda_dir(find_ptxas())
        self._count = 0
        del jax

    def _fake_cuda_dir(self, real_ptxas: str) -> str:
        """A CUDA directory for XLA whose bin/ptxas is the wrapper, with the real toolkit's libdevice beside it."""
        root = os.path.join(self.work_dir, "cuda")
        os.makedirs(os.path.join(root, "bin"), exist_ok=True)
        self._capture = os.path.join(self.work_dir, "ptxas-capture")
        wrapper = os.path.join(root, "bin", "ptxas")
        with open(wrapper, "w") as f:
            f.write(_PTXAS_WRAPPER.format(real=real_ptxas, capture="${PTXAS_CAPTURE_DIR}"))
        os.chmod(wrapper, 0o755)
        nvvm = os.path.join(os.path.dirname(os.path.dirname(real_ptxas)), "nvvm")
        if os.path.isdir(nvvm) and not os.path.exists(os.path.join(root, "nvvm")):
            os.symlink(nvvm, os.path.join(root, "nvvm"))
        return root

    def replicated(self):
        from jax.sharding import NamedSharding, PartitionSpec

        return NamedSharding(self.mesh, PartitionSpec())

    def compile(self, jitted, *args, ptxas_reports: bool = True, options: dict | None = None,
                **static) -> CompileReport:
        """Lower (under the mesh's abstract GPU, which Pallas' Triton lowering needs on jax 0.11) and compile
        `jitted` for these devices; args are abstract values placed on the mesh (ShapeDtypeStructs with
        shardings). ptxas_reports=False compiles the PTX in process, as on the device (3-4x faster for a whole
        model step, which runs ptxas once per kernel otherwise), and reports no registers."""
        import jax

        self._count += 1
        case_dir = tempfile.mkdtemp(prefix=f"{self._count:03d}-", dir=self.work_dir)
        dump, capture = os.path.join(case_dir, "xla"), os.path.join(case_dir, "ptxas")
        os.makedirs(capture)
        os.environ["PTXAS_CAPTURE_DIR"] = capture
        ptxas = {"xla_gpu_cuda_data_dir": self._cuda_dir, "xla_gpu_enable_libnvptxcompiler": False}
        start = time.perf_counter()
        with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):
            lowered = jitted.trace(*args, **static).lower()
        compiled = lowered.compile(compiler_options={
            "xla_dump_to": dump, **(ptxas if ptxas_reports else {}), **(options or {})})
        seconds = time.perf_counter() - start
        hlo = "".join(open(p).read() for p in glob.glob(os.path.join(dump, "*gpu_after_optimizations.txt")))
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
        return CompileReport(seconds=seconds, kernels=_kernels(dump, capture), hlo=hlo, cost=dict(cost),
                             memory=compiled.memory_analysis())


def _kernels(dump_dir: str, capture_dir: str) -> list[Kernel]:
    """Every launch in the thunk sequence, joined with ptxas's report of its entry."""
    reports = _ptxas_reports(capture_dir)
    kernels = []
    for path in glob.glob(os.path.join(dump_dir, "*thunk_sequence.txt")):
        for line in open(path):
            if m := _LAUNCH.search(line):
                grid = tuple(int(v) for v in m.group(2).split(","))
                threads = 1
                for v in m.group(3).split(","):
                    threads *= int(v)
                kernels.append(Kernel(m.group(1), grid, threads, int(m.group(4)), **reports.get(m.group(1), {})))
    return kernels


def _ptxas_reports(capture_dir: str) -> dict[str, dict]:
    """entry name -> registers, spills, stack and the PTX file, from the wrapper's captures."""
    reports = {}
    for err in sorted(glob.glob(os.path.join(capture_dir, "*.stderr"))):
        ptx = err[: -len(".stderr")] + ".ptx"
        for block in re.split(r"(?=ptxas info\s+: Compiling entry function)", open(err).read()):
            if not (entry := _ENTRY.search(block)):
                continue
            info = {"ptx": ptx if os.path.exists(ptx) else None}
            if s := _SPILLS.search(block):
                info.update(stack=int(s.group(1)), spill_stores=int(s.group(2)), spill_loads=int(s.group(3)))
            if r := _REGISTERS.search(block):
                info["registers"] = int(r.group(1))
            reports[entry.group(1)] = info
    return reports
