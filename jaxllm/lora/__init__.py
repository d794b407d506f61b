"""Multi-LoRA serving: PEFT adapters read into host arrays, held in device slots, applied per token at the dot."""

from jaxllm.lora.request import LoRARequest

__all__ = ["LoRARequest"]
