"""The routed MoE experts on the CPU as one native XLA FFI call (cpu_kernel.cc): each routed expert's weights are
read where they lie in the [E, ...] stacks (a jnp loop with a runtime expert index makes XLA:CPU copy the expert
out of the stack before its dot). Same contract as `moe_experts_reference`, tested against it. The library is built
at first use (pallas_kernels/native_build.py); `moe_kernel_error()` says why it cannot be on this machine (None
when it can).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.native_build import CpuTarget

KERNEL = CpuTarget(Path(__file__).with_name("cpu_kernel.cc"), "JaxllmMoeExperts", "jaxllm_moe_experts")
ACTIVATION_CODES = {"silu": 0, "gelu_tanh": 1}
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def native_supports(x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array) -> bool:
    """Whether the kernel takes these operands: dense stacks and x of one dtype, float32 or bfloat16 (not AWQ int4
    stacks, which have no one dtype)."""
    return x.dtype in DTYPES and all(hasattr(w, "dtype") and w.dtype == x.dtype for w in (w_gate_up, w_down))


def moe_experts_native(x: jax.Array, expert_ids: jax.Array, expert_weights: jax.Array, w_gate_up: jax.Array,
                       w_down: jax.Array, activation: str = "silu") -> jax.Array:
    """reference.py's contract: x [T, H], ids / weights [T, k], w_gate_up [E, 2I, H], w_down [E, H, I] -> [T, H]
    in x.dtype, on the calling thread."""
    if not native_supports(x, w_gate_up, w_down):
        raise ValueError(f"the native MoE kernel takes dense stacks of one dtype, float32 or bfloat16; got x "
                         f"{x.dtype}, w_gate_up {_dtype(w_gate_up)}, w_down {_dtype(w_down)}")
    KERNEL.register()
    call = jax.ffi.ffi_call(KERNEL.name, jax.ShapeDtypeStruct(x.shape, jnp.float32))
    out = call(x, expert_ids.astype(jnp.int32), expert_weights.astype(jnp.float32), w_gate_up, w_down,
               activation=np.int64(ACTIVATION_CODES[activation]))  # [T, H] f32
    return out.astype(x.dtype)


def _dtype(w) -> str | jnp.dtype:
    """A dense stack's dtype; "int4 (AWQ)" for a packed one."""
    return w.dtype if hasattr(w, "dtype") else "int4 (AWQ)"


def moe_kernel_error() -> str | None:
    """Why the native kernel cannot run here (no compiler, a build error), or None when it can; asked once."""
    return KERNEL.error
