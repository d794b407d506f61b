"""Row argmax on the CPU as one native XLA FFI call (cpu_kernel.cc), the sampler's greedy choice: x [R, V] float32
-> [R] int32. Same contract as reference.py's `argmax_rows`, tested against it. The library is built at first use
(pallas_kernels/native_build.py); `argmax_kernel_error()` says why it cannot be on this machine (None when it can).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from pallas_kernels.native_build import CpuTarget

KERNEL = CpuTarget(Path(__file__).with_name("cpu_kernel.cc"), "JaxllmArgmaxRows", "jaxllm_argmax_rows")


def argmax_rows_cpu(x: jax.Array) -> jax.Array:
    """x [R, V] float32 -> [R] int32: the first index of each row's largest value (NaN the largest)."""
    if x.ndim != 2 or x.dtype != jnp.float32 or x.shape[1] < 1:
        raise ValueError(f"the argmax kernel takes float32 x [R, V] with V >= 1; got {x.dtype}{list(x.shape)}")
    KERNEL.register()
    return jax.ffi.ffi_call(KERNEL.name, jax.ShapeDtypeStruct(x.shape[:1], jnp.int32))(x)


def argmax_kernel_error() -> str | None:
    """Why the native kernel cannot run here (no compiler, a build error), or None when it can; asked once."""
    return KERNEL.error
