"""What differs between the decoder families jaxllm runs: a small frozen description per family, read by the one
forward (model/llama.py), the loaders' tensor names and the parameter shapes. It describes; it computes nothing.

    family    norms                      activation  embed x sqrt(H)  q/k norm  qkv bias  checkpoint q|k|v, gate|up
    llama     x * w                      silu        no               no        no        apart
    mistral   x * w                      silu        no               no        no        apart
    qwen2     x * w                      silu        no               no        yes       apart
    qwen3     x * w                      silu        no               yes       no        apart
    gemma2    x * (1 + w), pre and post  gelu_tanh   yes              no        no        apart
    gemma3    x * (1 + w), pre and post  gelu_tanh   yes              yes       no        apart
    phi3      x * w                      silu        no               no        no        fused (qkv_proj, gate_up_proj)
    mixtral   x * w                      silu        no               no        no        apart; experts per expert
    qwen2_moe x * w                      silu        no               no        yes       apart; experts per expert
    qwen3_moe x * w                      silu        no               yes       no        apart; experts per expert

The mixture-of-experts families (model/moe.py) replace the MLP of their sparse layers by a router over E experts,
each token's top-k of them run (pallas_kernels.moe's contract); `experts` names where the checkpoint keeps them
(Mixtral: block_sparse_moe.experts.E.w1/w3/w2 and block_sparse_moe.gate; Qwen: mlp.experts.E.gate_proj/up_proj/
down_proj and mlp.gate), `shared_expert` adds Qwen2-MoE's dense shared expert gated by sigmoid(shared_expert_gate).

What varies per model rather than per family (the sliding window and which layers use it, the local rope base,
the attention scale, the soft-caps, the rope scaling) lives in ModelConfig.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Architecture:
    name: str
    norm_offset: float = 0.0  # norms scale by (norm_offset + weight): Gemma stores the weight as (scale - 1)
    sandwich_norms: bool = False  # Gemma 2/3: a norm after attention and after the MLP, before each residual add
    activation: str = "silu"  # of the gated MLP: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, tanh approximation)
    embed_scale: bool = False  # embeddings multiplied by sqrt(hidden_size) (in the activations' dtype)
    qk_norm: bool = False  # an RMSNorm over each q and k head (head_dim weights) before rope
    qkv_bias: bool = False  # q/k/v projections carry a bias
    fused_checkpoint: bool = False  # the checkpoint stores q|k|v and gate|up fused (Phi-3)
    experts: str = ""  # mixture of experts: the checkpoint's module of a sparse layer's MLP ("": a dense model)
    shared_expert: bool = False  # a sparse layer adds a dense shared expert gated per token (Qwen2-MoE)


ARCHITECTURES = {a.name: a for a in (
    Architecture("llama"),
    Architecture("mistral"),
    Architecture("qwen2", qkv_bias=True),
    Architecture("qwen3", qk_norm=True),
    Architecture("gemma2", norm_offset=1.0, sandwich_norms=True, activation="gelu_tanh", embed_scale=True),
    Architecture("gemma3", norm_offset=1.0, sandwich_norms=True, activation="gelu_tanh", embed_scale=True,
                 qk_norm=True),
    Architecture("phi3", fused_checkpoint=True),
    Architecture("mixtral", experts="block_sparse_moe"),
    Architecture("qwen2_moe", qkv_bias=True, experts="mlp", shared_expert=True),
    Architecture("qwen3_moe", qk_norm=True, experts="mlp"),
)}

# Hugging Face `architectures[0]` -> the family name used inside jaxllm.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}

# the hidden_act (or hidden_activation) values config.json may give for each activation
ACTIVATION_NAMES = {"silu": ("silu", "swish"), "gelu_tanh": ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new")}
