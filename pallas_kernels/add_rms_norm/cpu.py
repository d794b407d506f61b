"""A decoder layer's residual add and RMS norm on the CPU as one native XLA FFI call (cpu_kernel.cc) for a bfloat16
Llama-style model (the norm cast back before its scale): (x, a projection's float32 sums) -> (x + delta, the
normed sum), each rounded as reference.py's `add_rms_norm_reference` rounds them, tested against it. The library
is built at first use (pallas_kernels/native_build.py); `add_rms_norm_error()` says why it cannot be on this
machine.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.native_build import CpuTarget

KERNEL = CpuTarget(Path(__file__).with_name("cpu_kernel.cc"), "JaxllmAddRmsNorm", "jaxllm_add_rms_norm")


def add_rms_norm_cpu(x: jax.Array, delta: jax.Array, weight: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
    """x [T, H] bfloat16, delta [T, H] float32, weight [H] bfloat16 -> (sum, normed) [T, H] bfloat16 each."""
    if x.ndim != 2 or x.dtype != jnp.bfloat16 or delta.shape != x.shape or delta.dtype != jnp.float32 \
            or weight.shape != x.shape[1:] or weight.dtype != jnp.bfloat16:
        raise ValueError(f"the add_rms_norm kernel takes x [T, H] bfloat16, delta [T, H] float32 and weight [H] "
                         f"bfloat16; got {x.dtype}{list(x.shape)}, {delta.dtype}{list(delta.shape)}, "
                         f"{weight.dtype}{list(weight.shape)}")
    KERNEL.register()
    out = jax.ShapeDtypeStruct(x.shape, jnp.bfloat16)
    return tuple(jax.ffi.ffi_call(KERNEL.name, (out, out))(x, delta, weight, eps=np.float32(eps)))


def add_rms_norm_error() -> str | None:
    """Why the native kernel cannot run here (no compiler, a build error), or None when it can; asked once."""
    return KERNEL.error
