"""PEFT LoRA adapters of the tiny test models (torch CPU, random A and B: init_lora_weights=False, so that B is not
zero), and the Hugging Face reference: the base model with the adapter merged into its weights."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_peft_adapter(hf_model, directory: Path, *, rank: int = 8, alpha: float = 16.0, seed: int = 0,
                      target_modules=tuple(ALL_MODULES), use_rslora: bool = False, scale: float = 0.3,
                      **config_kwargs):
    """Write a PEFT adapter of `hf_model` (untouched) to `directory`; returns (directory, the merged torch
    model). `scale` sets the std of A and B, so that the delta moves the logits clearly."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(target_modules), init_lora_weights=False,
                        use_rslora=use_rslora, **config_kwargs)
    peft_model = get_peft_model(copy.deepcopy(hf_model), config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, scale)
    peft_model.save_pretrained(str(directory))
    return directory, peft_model.merge_and_unload().eval()


def hf_logits(model, token_ids) -> np.ndarray:
    """[len(token_ids), V] float32 logits of the whole sequence."""
    with torch.no_grad():
        return model(torch.tensor(np.asarray(token_ids)[None])).logits[0].float().numpy()


def hf_greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy continuation by the HF model (full recompute per token: tiny models, few tokens)."""
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(int(np.argmax(hf_logits(model, tokens)[-1])))
    return tokens[len(prompt):]
