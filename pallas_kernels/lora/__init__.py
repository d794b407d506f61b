"""Multi-LoRA: each token's low-rank adapter delta, for adapters held in device slots: the jnp reference and the
Pallas (Triton) kernel tested against it."""

from pallas_kernels.lora.kernel import lora_delta
from pallas_kernels.lora.reference import lora_delta_reference

__all__ = ["lora_delta", "lora_delta_reference"]
