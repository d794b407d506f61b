"""Bytes of one split-KV decode attention call at Llama-3 shapes, from a deviceless sm_90a (H200) compile.

Nothing runs and nothing is timed: the call is compiled for an H200 on a CPU-only machine by the deviceless GPU
compile script (`compile_kernels.py`, kept outside this repository; pass its folder as --compile-script-dir), and the
bytes are read off what the compiler produced:

    partials written   the Triton call's outputs (o_part, lse): every program stores its block once
    partials read      operand bytes of the XLA ops that consume those outputs (the merge's fusions)
    K/V read           sum over sequences of context x Hkv x D x itemsize x 2: the kernel's masked loads read only
                       the keys of each context (the pool itself is a [L, N, Hkv, B, D] operand, never read whole)
    XLA bytes          XLA's HloCostAnalysis "bytes accessed" of the optimized module (run through the CPU client:
                       the compile-only device has no cost analysis of its own); it covers XLA's own ops (the merge
                       and the scatter to tokens): the Triton custom call is opaque to it, it enters the sum as
                       -1 ("unknown"), and that -1 is added back here
    total              K/V read + q read + partials written + XLA bytes (the merge's reads and the output write)

plus the kernel's grid, registers, spills and shared memory from ptxas and XLA's thunk sequence.

    python benchmarks/split_kv_bytes.py --compile-script-dir DIR [--repo .] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile

D, BLOCK = 128, 16  # head_dim and pool block size of Llama-3
SHAPES = [  # (name, batch, context, Hq, Hkv, layers)
    ("8B b1 ctx8192", 1, 8192, 32, 8, 32),
    ("8B b64 ctx4096", 64, 4096, 32, 8, 32),
    ("8B b256 ctx1024", 256, 1024, 32, 8, 32),
    ("70B b1 ctx8192", 1, 8192, 64, 8, 80),
]
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "s8": 1, "u8": 1, "pred": 1, "f64": 8, "s64": 8, "u32": 4}


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string, tuples included: 'f32[1,8,4]{2,1,0}' or '(f32[2]{0}, s32[])'."""
    total = 0
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape):
        size = DTYPE_BYTES[dtype]
        for d in filter(None, dims.split(",")):
            size *= int(d)
        total += size
    return total


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis that closes the one at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError(text)


def entry_instructions(hlo: str) -> list[tuple[str, str, str, list[str]]]:
    """(name, shape, opcode, operand names) of each instruction of the optimized module's ENTRY computation."""
    body = hlo[hlo.index("\nENTRY "):]
    body = body[body.index("{\n") + 2:body.index("\n}")]
    out = []
    for line in body.splitlines():
        m = re.match(r"\s*(?:ROOT )?%(\S+) = ", line)
        if not m:
            continue
        rest = line[m.end():]
        shape_end = _closing(rest, 0) + 1 if rest.startswith("(") else rest.index(" ")
        shape, rest = rest[:shape_end], rest[shape_end + 1:]
        opcode = rest[:rest.index("(")]
        args = rest[len(opcode):_closing(rest, len(opcode)) + 1]
        out.append((m.group(1), shape, opcode, re.findall(r"%([\w.\-]+(?:#\d+)?)", args)))
    return out


def tuple_parts(shape: str) -> list[str]:
    return re.findall(r"\w+\[[\d,]*\]", shape) if shape.startswith("(") else [shape]


def partial_traffic(hlo: str) -> tuple[int, int]:
    """(bytes the Triton call writes, bytes XLA's ops read of them) from the optimized HLO."""
    instrs = entry_instructions(hlo)
    call = next(i for i in instrs if i[2] == "custom-call" and "pallas" in i[0])
    parts = [shape_bytes(p) for p in tuple_parts(call[1])]
    produced = {f"{call[0]}#{k}": b for k, b in enumerate(parts)}
    for name, shape, opcode, ops in instrs:  # explicit get-tuple-element instructions, if XLA kept any
        if opcode == "get-tuple-element" and ops and ops[0] == call[0]:
            produced[name] = shape_bytes(shape)
    read = sum(produced.get(op, 0) for name, _, opcode, ops in instrs
               if opcode != "get-tuple-element" and name != call[0] for op in ops)
    return sum(parts), read


def attn_args(batch, context, hq, hkv, layers):
    """Abstract arguments of a decode-only step: every sequence at `context`, bf16 pools sized to hold them."""
    import jax
    import jax.numpy as jnp

    S = jax.ShapeDtypeStruct
    blocks = 1 + batch * (context // BLOCK)
    pool = S((layers, blocks, hkv, BLOCK, D), jnp.bfloat16)  # [L, N, Hkv, B, D]
    return (S((batch, hq, D), jnp.bfloat16), pool, pool, S((), jnp.int32), S((batch, context // BLOCK), jnp.int32),
            S((batch,), jnp.int32), S((batch + 1,), jnp.int32))


def compile_call(ck, setup, name, args):
    """Compile the attention call deviceless, as the compile script does -> (compiled, thunks, ptxas reports)."""
    import functools

    import jax

    from pallas_kernels.paged_attention import split_kv_paged_attention

    mesh, sharding, fake_cuda, work, _ = setup
    slug = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")
    dump, capture = os.path.join(work, slug, "xla"), os.path.join(work, slug, "ptxas")
    os.makedirs(capture, exist_ok=True)
    os.environ["PTXAS_CAPTURE_DIR"] = capture  # the ptxas wrapper keeps its -v report there
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in args]
    fn = functools.partial(split_kv_paged_attention, sm_scale=D ** -0.5)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        lowered = jax.jit(fn).trace(*args).lower()
    compiled = lowered.compile(compiler_options={"xla_dump_to": dump, "xla_gpu_cuda_data_dir": fake_cuda,
                                                 "xla_gpu_enable_libnvptxcompiler": False})
    return compiled, ck.parse_thunks(dump), ck.parse_ptxas(capture)


def measure(ck, setup, name, batch, context, hq, hkv, layers) -> dict:
    from jax._src.lib import _jax

    compiled, thunks, ptxas = compile_call(ck, setup, name, attn_args(batch, context, hq, hkv, layers))
    kernel = next(t for t in thunks if t["name"].startswith("split_kv_paged_attention"))
    regs = ptxas.get(kernel["name"], {})
    module = compiled.runtime_executable().hlo_modules()[0]
    written, read = partial_traffic(module.to_string())
    xla_bytes = _jax.hlo_module_cost_analysis(setup[4], module)["bytes accessed"] + 1  # the Triton call's -1
    kv = batch * context * hkv * D * 2 * 2  # K and V, bf16, every sequence at the full context
    q_bytes = batch * hq * D * 2
    num_splits = kernel["grid"][2]
    return dict(shape=name, grid="x".join(map(str, kernel["grid"])), num_splits=num_splits,
                split=-(-context // num_splits), partials_written=written, partials_read=read, kv_read=kv,
                xla_bytes_accessed=xla_bytes, total=kv + q_bytes + written + xla_bytes, regs=regs.get("regs"),
                spill=f"{regs.get('spill_st', '?')}/{regs.get('spill_ld', '?')}", smem_kib=kernel["smem"] / 1024,
                temp_bytes=compiled.memory_analysis().temp_size_in_bytes)


def markdown(rows: list[dict]) -> str:
    mb = lambda b: f"{b / 1e6:.2f}"
    head = ("shape | grid (S x Hkv x NS) | keys/split | partials written MB | partials read MB | K/V read MB | "
            "(written + read) / K/V | XLA bytes accessed MB | total MB | regs | spill st/ld | smem KiB")
    lines = [head, " | ".join(["---"] * len(head.split(" | ")))]
    for r in rows:
        ratio = (r["partials_written"] + r["partials_read"]) / r["kv_read"]
        lines.append(" | ".join([r["shape"], r["grid"], str(r["split"]), mb(r["partials_written"]),
                                 mb(r["partials_read"]), mb(r["kv_read"]), f"{100 * ratio:.1f}%",
                                 mb(r["xla_bytes_accessed"]), mb(r["total"]), str(r["regs"]), r["spill"],
                                 f"{r['smem_kib']:.1f}"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compile-script-dir", required=True, help="folder of the deviceless compile script")
    parser.add_argument("--repo", default=".", help="the checkout whose kernels are compiled")
    parser.add_argument("--work", default=None, help="where the XLA dumps go (default: a temp dir)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.compile_script_dir))
    sys.path.insert(0, os.path.abspath(args.repo))
    import compile_kernels as ck  # sets JAX_PLATFORMS=cpu before jax is imported
    import jax
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    real_ptxas, nvvm = ck.find_real_ptxas(None)
    topo = topologies.get_topology_desc("h200", "cuda", target_config=ck.H200_TARGET_CONFIG, topology="1x1x1")
    mesh = topologies.make_mesh(topo, (1,), ("x",))
    jax.default_backend = lambda: "gpu"  # as the compile script does: the project picks GPU paths off it
    setup = (mesh, NamedSharding(mesh, PartitionSpec()), ck.make_fake_cuda_dir(real_ptxas, nvvm),
             args.work or tempfile.mkdtemp(prefix="split-kv-bytes-"), jax.local_devices(backend="cpu")[0].client)
    print(f"jax {jax.__version__}, {topo.devices[0].device_kind} (compile-only)", flush=True)
    rows = [measure(ck, setup, *shape) for shape in SHAPES]
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
