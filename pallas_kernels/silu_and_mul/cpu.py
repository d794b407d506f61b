"""The gated MLP's SiLU and product on the CPU as one native XLA FFI call (cpu_kernel.cc) for a bfloat16 model: the
gate_up projection's float32 sums [T, 2F] -> [T, F] bfloat16. Same result as reference.py's
`gated_activation_reference` with "silu" on those sums rounded to bfloat16, tested against it. The library is built
at first use (pallas_kernels/native_build.py); `silu_and_mul_error()` says why it cannot be on this machine.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from pallas_kernels.native_build import CpuTarget

KERNEL = CpuTarget(Path(__file__).with_name("cpu_kernel.cc"), "JaxllmSiluAndMul", "jaxllm_silu_and_mul")


def silu_and_mul_cpu(gate_up: jax.Array) -> jax.Array:
    """gate_up [..., 2F] float32 -> silu(gate) * up [..., F] bfloat16, rounded as the reference rounds a bfloat16
    model's (gate and up, the activation, the product)."""
    if gate_up.ndim < 1 or gate_up.dtype != jnp.float32 or gate_up.shape[-1] % 2:
        raise ValueError(f"the silu_and_mul kernel takes float32 gate_up [..., 2F]; got {gate_up.dtype}"
                         f"{list(gate_up.shape)}")
    lead = gate_up.shape[:-1]
    gate_up = gate_up.reshape(-1, gate_up.shape[-1])  # [T, 2F]
    KERNEL.register()
    out = jax.ShapeDtypeStruct((gate_up.shape[0], gate_up.shape[1] // 2), jnp.bfloat16)
    return jax.ffi.ffi_call(KERNEL.name, out)(gate_up).reshape(*lead, out.shape[1])


def silu_and_mul_error() -> str | None:
    """Why the native kernel cannot run here (no compiler, a build error), or None when it can; asked once."""
    return KERNEL.error
