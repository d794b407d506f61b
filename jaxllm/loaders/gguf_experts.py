"""Mixture-of-experts GGUF files (llama.cpp): the expert metadata and the stacked expert tensors.

    general.architecture   family      renormalized top-k ({arch}.expert_weights_norm, else llama.cpp's rule)
    llama + expert_count   mixtral     yes
    qwen2moe               qwen2_moe   no (+ the shared expert: ffn_*_shexp, ffn_gate_inp_shexp)
    qwen3moe               qwen3_moe   yes

    blk.N.ffn_gate_inp.weight   [E, H]      the router
    blk.N.ffn_gate_exps.weight  [E, I, H]   every expert's gate rows (ffn_up_exps the same; ffn_down_exps [E, H, I])

A stacked tensor is handed to assemble_params expert by expert (views, no copy), as the per-expert fields a
Hugging Face checkpoint has, so that one place checks and stacks them. llama.cpp has no dense layers among sparse
ones (Qwen's mlp_only_layers): every layer of these files is sparse. Only softmax gating is read.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from jaxllm.file_fields import FieldReader, short_repr
from jaxllm.model.params import expert_field

MOE_ARCHITECTURES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}  # and llama with expert_count: mixtral
_NORMALIZED = {"llama": True, "qwen2moe": False, "qwen3moe": True}
SOFTMAX_GATING = 1  # gguf's ExpertGatingFuncType.SOFTMAX

EXPERT_LAYER_NAMES = {"ffn_gate_inp.weight": "router", "ffn_gate_exps.weight": "experts.gate",
                      "ffn_up_exps.weight": "experts.up", "ffn_down_exps.weight": "experts.down"}
SHARED_EXPERT_NAMES = {"ffn_gate_shexp.weight": "w_shared_gate", "ffn_up_shexp.weight": "w_shared_up",
                       "ffn_down_shexp.weight": "w_shared_down", "ffn_gate_inp_shexp.weight": "shared_gate"}


def gguf_family(arch: str, expert_count: int) -> str | None:
    """The jaxllm family of a MoE file's architecture, or None when the file is not one."""
    if arch == "llama" and expert_count:
        return "mixtral"
    return MOE_ARCHITECTURES.get(arch)


def gguf_moe_fields(meta: FieldReader, arch: str) -> dict:
    """ModelConfig's expert fields from {arch}.expert_*; a missing or bad key is a ModelLoadError naming it."""
    experts = meta.integer(f"{arch}.expert_count")
    gating = meta.integer(f"{arch}.expert_gating_func", SOFTMAX_GATING)
    if gating != SOFTMAX_GATING:
        raise meta.error(f"{arch}.expert_gating_func", f"{short_repr(gating)} is not supported (only softmax, 1)")
    fields = dict(num_experts=experts, num_experts_per_tok=meta.integer(f"{arch}.expert_used_count", maximum=experts),
                  norm_topk_prob=meta.flag(f"{arch}.expert_weights_norm", _NORMALIZED[arch]),
                  moe_intermediate_size=meta.integer(f"{arch}.expert_feed_forward_length")
                  if arch != "llama" else meta.integer(f"{arch}.feed_forward_length"))
    if arch == "qwen2moe":
        fields["shared_expert_intermediate_size"] = meta.integer(f"{arch}.expert_shared_feed_forward_length")
    return fields


def split_experts(field: str, array: np.ndarray, name: str) -> Iterator[tuple[str, str, np.ndarray]]:
    """A stacked "experts.{part}" tensor [E, ...] -> (expert field, name, [...] view) per expert; any other field
    as it is (the shared expert's gate [H] as the [1, H] Hugging Face stores)."""
    if not field.startswith("experts."):
        yield field, name, array.reshape(1, -1) if field == "shared_gate" and array.ndim == 1 else array
        return
    part = field.partition(".")[2]
    for e in range(array.shape[0]):
        yield expert_field(e, part), f"{name}[{e}]", array[e]
