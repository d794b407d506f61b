"""LoRARequest: which adapter a request runs with (vLLM's name and fields)."""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class LoRARequest:
    """lora_name: the adapter's name (the server's `model` field picks it by this); lora_int_id: a positive id,
    unique per adapter (the prefix cache and the device slots are keyed by it); lora_path: a PEFT directory
    (adapter_config.json + adapter_model.safetensors)."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"LoRARequest.lora_name must be a non-empty string, got {self.lora_name!r}")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"LoRARequest.lora_int_id must be an int >= 1 (0 is the base model), got "
                             f"{self.lora_int_id!r}")
        if not isinstance(self.lora_path, (str, os.PathLike)) or not str(self.lora_path):
            raise ValueError(f"LoRARequest.lora_path must be a path, got {self.lora_path!r}")
        object.__setattr__(self, "lora_path", os.fspath(self.lora_path))
