"""Kernels: which implementation runs each of the model's custom operations, decided once per engine.

    operation    implementations           "auto" picks
    attention    pallas, cpu, reference    pallas on a GPU; else cpu (the native kernel, built at first use), or
                                           reference (with a warning) where no C++ compiler can build it
    awq_matmul   pallas, reference         pallas on a GPU; else reference (interpret mode is far too slow for a model)
    lora_matmul  pallas, reference         pallas on a GPU; else reference
    kv_write     cpu, reference            cpu on CPU where it builds (XLA:CPU has no bfloat16 scatter); else reference
    moe          pallas, cpu, reference    pallas on a GPU; else cpu (routed: the native kernel where it builds,
                                           else a jnp loop; work follows the routes, not E)
    matvec16     direct, two_rows, native  native on CPU where it builds (a dense 2-D weight's dot with at most 8
                                           rows of x runs the native skinny kernel, save a one-row float32 dot:
                                           weights.py), else two_rows (a one-row dot with a 16-bit dense weight runs
                                           as a two-row product, as float16 ones do under native too); direct
                                           (XLA's own dot) on a GPU
    argmax       cpu, reference            cpu on CPU where it builds (the sampler's argmax over the vocabulary:
                                           XLA:CPU does not vectorize jnp.argmax); else reference
    silu_and_mul cpu, reference            cpu on CPU where it builds (the gated MLP's bfloat16 SiLU and product
                                           from 128 rows, layers.py: XLA:CPU's exp costs ~1 ns an element); else
                                           reference
    amx_matmul   cpu, reference            cpu on a CPU with AMX-BF16 or AVX512-BF16 where it builds (a bfloat16
                                           LM head and the layers' dense linears on one device are stored as AMX
                                           tiles and their dots run the tiled kernel: model/tiled_params.py); else
                                           reference (they stay dense)
    add_rms_norm cpu, reference            cpu on CPU where it builds (a bfloat16 Llama-style layer's residual add
                                           and the norm after it as one call, on one device: llama.py); else
                                           reference

The runner builds one frozen `Kernels` from the engine arguments (`select_kernels`) and the model code reads its
fields; a Pallas kernel chosen where there is no GPU runs in interpret mode (`interpret`: tests). This module is
the only place in the library that asks which backend JAX runs on (`on_gpu`).
"""

from __future__ import annotations

import dataclasses
import logging

import jax

from pallas_kernels.add_rms_norm.cpu import add_rms_norm_error
from pallas_kernels.amx_matmul.cpu import amx_matmul_error
from pallas_kernels.argmax.cpu import argmax_kernel_error
from pallas_kernels.paged_attention.cpu_kernel import cpu_kernel_error
from pallas_kernels.paged_attention.cpu_kv_write import cpu_write_kv_error
from pallas_kernels.silu_and_mul.cpu import silu_and_mul_error
from pallas_kernels.skinny_matmul.cpu import skinny_kernel_error

logger = logging.getLogger(__name__)

CHOICES = {"attention": ("cpu", "pallas", "reference"), "awq_matmul": ("pallas", "reference"),
           "lora_matmul": ("pallas", "reference"), "kv_write": ("cpu", "reference"),
           "moe": ("cpu", "pallas", "reference"), "matvec16": ("direct", "two_rows", "native"),
           "argmax": ("cpu", "reference"), "silu_and_mul": ("cpu", "reference"),
           "amx_matmul": ("cpu", "reference"), "add_rms_norm": ("cpu", "reference")}


@dataclasses.dataclass(frozen=True)
class Kernels:
    """The implementation of each operation (CHOICES); hashable, so jitted functions take it as a static argument.
    Built directly it means what it says (a lowering for CUDA wants Pallas with interpret=False off a GPU)."""
    attention: str = "reference"
    awq_matmul: str = "reference"
    lora_matmul: str = "reference"
    kv_write: str = "reference"
    moe: str = "reference"
    matvec16: str = "direct"
    argmax: str = "reference"
    silu_and_mul: str = "reference"
    amx_matmul: str = "reference"
    add_rms_norm: str = "reference"
    interpret: bool = False  # Pallas kernels run in interpret mode (no GPU)

    def __post_init__(self):
        for field, allowed in CHOICES.items():
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field} implementation {getattr(self, field)!r} is unknown; choose one of "
                                 f"{', '.join(allowed)} (or auto)")


REFERENCE = Kernels()  # plain jnp everywhere: the ground truth


def select_kernels(attention: str = "auto", awq_matmul: str = "auto", lora_matmul: str = "auto",
                   kv_write: str = "auto", moe: str = "auto") -> Kernels:
    """Each "auto" resolved for this backend (the module docstring); an explicit choice that cannot run here is a
    ValueError that says why."""
    gpu = on_gpu()
    return Kernels(attention=resolve_attention(attention),
                   awq_matmul=_pallas_on_gpu(awq_matmul, gpu), lora_matmul=_pallas_on_gpu(lora_matmul, gpu),
                   kv_write=_resolve_kv_write(kv_write, gpu), moe=_resolve_moe(moe, gpu),
                   matvec16=_resolve_matvec16(gpu), argmax=_resolve_argmax(gpu),
                   silu_and_mul=_resolve_silu_and_mul(gpu), amx_matmul=_resolve_amx_matmul(gpu),
                   add_rms_norm=_resolve_add_rms_norm(gpu), interpret=not gpu)


def resolve_attention(name: str) -> str:
    """The attention implementation `name` stands for ("auto" resolved); "cpu" where its kernel cannot be built
    is an error that says why."""
    if name == "auto":
        name = "pallas" if on_gpu() else _cpu_or_reference()
    if name not in CHOICES["attention"]:
        raise ValueError(f"attention backend {name!r} is unknown; choose one of "
                         f"{sorted(CHOICES['attention'])} or 'auto'")
    if name == "cpu" and (error := cpu_kernel_error()) is not None:
        raise ValueError(f"attention backend 'cpu' cannot run here: {error}")
    return name


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def _pallas_on_gpu(name: str, gpu: bool) -> str:
    if name == "auto":
        return "pallas" if gpu else "reference"
    return name


def _resolve_kv_write(name: str, gpu: bool) -> str:
    if name == "auto":
        return "reference" if gpu or cpu_write_kv_error() is not None else "cpu"
    if name == "cpu" and (error := cpu_write_kv_error()) is not None:
        raise ValueError(f"kv_write 'cpu' cannot run here: {error}")
    return name


def _resolve_moe(name: str, gpu: bool) -> str:
    if name == "auto":
        return "pallas" if gpu else "cpu"
    return name


def _resolve_matvec16(gpu: bool) -> str:
    if gpu:
        return "direct"
    return "native" if skinny_kernel_error() is None else "two_rows"


def _resolve_argmax(gpu: bool) -> str:
    return "cpu" if not gpu and argmax_kernel_error() is None else "reference"


def _resolve_silu_and_mul(gpu: bool) -> str:
    return "cpu" if not gpu and silu_and_mul_error() is None else "reference"


def _resolve_add_rms_norm(gpu: bool) -> str:
    return "cpu" if not gpu and add_rms_norm_error() is None else "reference"


def _resolve_amx_matmul(gpu: bool) -> str:
    return "cpu" if not gpu and amx_matmul_error() is None else "reference"


def _cpu_or_reference() -> str:
    error = cpu_kernel_error()
    if error is None:
        return "cpu"
    logger.warning("the native CPU attention kernel cannot be built, so attention runs the slower jnp reference: %s",
                   error)
    return "reference"
