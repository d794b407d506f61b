"""The multi-LoRA delta in plain jnp: the exact oracle for the Pallas kernel and the CPU path of the engine.

    x            [T, K]      one step's tokens (any float dtype)
    a            [S, R, K]   the A matrices of S adapter slots (R = the padded rank; a fused projection stacks its
                             parts' ranks here)
    b            [S, N, R]   the B matrices, the LoRA scaling folded in
    token_slots  [T] int32   0: the base model (no delta); s in 1..S: the adapter in slot s, i.e. a[s-1], b[s-1]
                             (any other value also gives no delta)

    delta[t] = b[s-1] @ (a[s-1] @ x[t])  for s = token_slots[t] > 0, else 0     -> [T, N] float32

The shrink a @ x (a rounded to x's dtype) is accumulated in float32 and rounded once to b's dtype before the expand
(also accumulated in float32), as a kernel does when it keeps the [R] intermediate in registers. The Pallas kernel
`pallas_kernels.lora.lora_delta` has the same contract and is tested against this function.

Every slot's A is applied to every token as one matmul (x @ A_all.T, A_all [S*R, K]), the tokens' other slots
masked to zero, and the expand is one more matmul over (slot, rank): on a CPU two dense dots beat gathering an
[R, K] matrix per token by far (the gather moves T*R*K values; these dots cost 2*T*S*R*(K + N) flops with S
small).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def lora_delta_reference(x: jax.Array, a: jax.Array, b: jax.Array, token_slots: jax.Array) -> jax.Array:
    """-> [T, N] float32: each token's adapter delta (0 for slot 0)."""
    num_slots = a.shape[0]
    shrink = jnp.einsum("tk,srk->tsr", x, a.astype(x.dtype), preferred_element_type=jnp.float32)  # [T, S, R]
    mine = token_slots[:, None] == jnp.arange(1, num_slots + 1, dtype=token_slots.dtype)  # [T, S]
    shrink = jnp.where(mine[:, :, None], shrink, 0.0).astype(b.dtype)
    return jnp.einsum("tsr,snr->tn", shrink, b, preferred_element_type=jnp.float32)  # [T, N]
