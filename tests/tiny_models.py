"""Tiny random-weight Hugging Face models (torch CPU) saved as safetensors: the reference for model tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, MixtralConfig, MixtralForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2MoeConfig,
                          Qwen2MoeForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

AWQ_GROUP = 16  # a quantization group size that divides every tiny model's input sizes (48, 64, 128)

_COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               max_position_embeddings=256, rms_norm_eps=1e-5, initializer_range=0.1)

# name -> (config class, model class, config overrides); together they cover MHA and GQA ratios 2, 3 and 4,
# explicit head_dim, Llama 3 rope scaling, tied and untied embeddings and q/k/v biases.
VARIANTS = {
    "llama2": (LlamaConfig, LlamaForCausalLM, dict(num_attention_heads=4, num_key_value_heads=4)),
    "llama3": (LlamaConfig, LlamaForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=32))),
    "smollm2": (LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=48, num_attention_heads=3, num_key_value_heads=1, tie_word_embeddings=True, rope_theta=1e5)),
    "mistral": (MistralConfig, MistralForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=1, head_dim=32, sliding_window=None)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6)),
    # the families of issue 29: windows shorter than the tests' contexts (5-7 tokens against 9-23), head sizes
    # 16 to 256, soft-caps small enough to bite, every rope scaling type
    "mistral_window": (MistralConfig, MistralForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, sliding_window=5)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True, rope_theta=1e6)),
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=6,
        attn_logit_softcapping=2.0, final_logit_softcapping=3.0, num_hidden_layers=3, rms_norm_eps=1e-6)),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, dict(
        num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=5,
        num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": dict(rope_type="linear", factor=2.0, rope_theta=10000.0),
                         "sliding_attention": dict(rope_type="default", rope_theta=100.0)})),
    "phi3": (Phi3Config, Phi3ForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, sliding_window=7, pad_token_id=None,
        original_max_position_embeddings=64, rope_scaling=dict(
            rope_type="longrope", short_factor=[1.0 + i / 16 for i in range(8)],
            long_factor=[2.0 + i / 4 for i in range(8)], original_max_position_embeddings=64))),
    "llama_linear": (LlamaConfig, LlamaForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, rope_scaling=dict(rope_type="linear", factor=3.0))),
    "llama_dynamic": (LlamaConfig, LlamaForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, rope_scaling=dict(rope_type="dynamic", factor=4.0))),
    "qwen2_yarn": (Qwen2Config, Qwen2ForCausalLM, dict(
        num_attention_heads=2, num_key_value_heads=1, rope_theta=1e6, rope_scaling=dict(
            rope_type="yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=16.0))),
    # mixture of experts (issue 33): 8 experts (expert parallelism over 2 and 4 devices), 2 per token; Qwen2-MoE
    # with its shared expert; Qwen3-MoE with the top-k renormalized and a dense layer by mlp_only_layers, and not
    # renormalized with a dense layer by decoder_sparse_step
    "mixtral": (MixtralConfig, MixtralForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=32, num_local_experts=8,
        num_experts_per_tok=2)),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=False)),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1])),
    "qwen3_moe_sparse_step": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=3,
        moe_intermediate_size=32, norm_topk_prob=False, decoder_sparse_step=2, tie_word_embeddings=True)),
}
_SEEDS = {name: i for i, name in enumerate(sorted(["llama2", "llama3", "smollm2", "mistral", "qwen2"]))}
NEW_FAMILIES = ("mistral_window", "qwen3", "gemma2", "gemma3", "phi3")  # with windows, soft-caps, q/k norms
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "qwen3_moe_sparse_step")


def save_tiny_hf_model(variant: str, directory: Path):
    config_cls, model_cls, overrides = VARIANTS[variant]
    torch.manual_seed(_SEEDS.get(variant, 100 + list(VARIANTS).index(variant)))
    model = model_cls(config_cls(**{**_COMMON, **overrides})).eval()
    if variant.startswith("qwen2"):  # biases start at zero; make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 0.5)
    if variant in MOE_FAMILIES:  # routers may start at zero (every expert tied); make the routing decisive
        with torch.no_grad():
            for name, weight in model.named_parameters():
                if name.endswith("gate.weight") and "gate_proj" not in name:  # the router, the shared expert's gate
                    weight.normal_(0.0, 0.5)
    if variant in NEW_FAMILIES + MOE_FAMILIES:  # norms start at 1 (Gemma: at 0, meaning 1); make their weights matter
        with torch.no_grad():
            for name, weight in model.named_parameters():
                if "norm" in name:
                    weight.add_(torch.randn_like(weight) * 0.3)
    model.save_pretrained(directory, safe_serialization=True)
    return directory, model


HF_TO_GGUF = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
HF_TO_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}


def permute_rope_rows(w, num_heads: int):
    """Hugging Face row order -> llama.cpp's (the inverse of loaders.gguf.unpermute_rope_rows)."""
    head_dim = w.shape[0] // num_heads
    return w.reshape(num_heads, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, path: Path, arch: str = "llama", matrix_type=None, tensor_overrides=None) -> Path:
    """Write an HF model as a llama.cpp-style GGUF: Q/K rows permuted (llama arch), 2-D weights stored as
    `matrix_type` (default F32), everything else F32. tensor_overrides: name -> (raw numpy data, GGML type)."""
    import gguf
    from gguf.quants import quantize

    cfg = model.config
    qtype = matrix_type or gguf.GGMLQuantizationType.F32
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)  # Gemma 3: keyed by layer type
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    _write_family_metadata(writer, model, arch)
    overrides = tensor_overrides or {}
    for hf_name, array in _gguf_arrays(model):
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        name = _gguf_name(hf_name, arch)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            array = array + 1  # llama.cpp stores Gemma's norms as (1 + w)
        if arch == "llama" and ".attn_q." in name:
            array = permute_rope_rows(array, cfg.num_attention_heads)
        elif arch == "llama" and ".attn_k." in name:
            array = permute_rope_rows(array, cfg.num_key_value_heads)
        if name in overrides:
            data, raw_type = overrides[name]
            writer.add_tensor(name, data, raw_dtype=raw_type)
        elif array.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gguf_arrays(model):
    """(HF name, float32 array) of each tensor, a MoE layer's fused [E, 2I, H] experts split into its gate and up
    halves as llama.cpp stores them."""
    for hf_name, tensor in model.state_dict().items():
        array = tensor.float().numpy()
        if hf_name.endswith("mlp.experts.gate_up_proj"):
            gate, up = np.split(array, 2, axis=1)  # [E, I, H] each
            yield hf_name.replace("gate_up_proj", "gate_exps"), gate
            yield hf_name.replace("gate_up_proj", "up_exps"), up
        else:
            yield hf_name, array


def _gguf_name(hf_name: str, arch: str = "llama") -> str:
    if hf_name in HF_TO_GGUF:
        return HF_TO_GGUF[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    names = {**HF_TO_GGUF_LAYER, **_FAMILY_GGUF_LAYER, **_MOE_GGUF_LAYER,
             **(_GEMMA_GGUF_LAYER if arch.startswith("gemma") else {})}
    return f"blk.{layer}.{names[rest]}"


# llama.cpp's names for what the new families add (gguf's MODEL_TENSOR table)
_FAMILY_GGUF_LAYER = {"self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
                      "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight"}
_MOE_GGUF_LAYER = {"mlp.gate.weight": "ffn_gate_inp.weight", "mlp.experts.gate_exps": "ffn_gate_exps.weight",
                   "mlp.experts.up_exps": "ffn_up_exps.weight", "mlp.experts.down_proj": "ffn_down_exps.weight",
                   "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
                   "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
                   "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
                   "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight"}
_GEMMA_GGUF_LAYER = {"post_attention_layernorm.weight": "post_attention_norm.weight",
                     "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                     "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}


def _write_family_metadata(writer, model, arch: str) -> None:
    """The keys (and Phi-3's rope factor tensors) a llama.cpp conversion writes for the window, the soft-caps, the
    second rope base and the rope scaling."""
    import gguf
    import numpy as np

    cfg = model.config
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    if experts:  # what llama.cpp's converter writes for a MoE model
        writer.add_expert_count(experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
        if hasattr(cfg, "moe_intermediate_size"):
            writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
            writer.add_expert_weights_norm(cfg.norm_topk_prob)
        if hasattr(cfg, "shared_expert_intermediate_size"):
            writer.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    if getattr(cfg, "sliding_window", None):  # Qwen2-MoE's config says 0 for none
        writer.add_sliding_window(cfg.sliding_window)
    if arch == "gemma3":  # its layer pattern as one flag per layer (true: sliding)
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
        writer.add_rope_freq_base_swa(float(cfg.rope_parameters["sliding_attention"]["rope_theta"]))
        full = cfg.rope_parameters["full_attention"]
        if full.get("rope_type") == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(full["factor"])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
        writer.add_float32(f"{arch}.attention.scale", cfg.query_pre_attn_scalar ** -0.5)
    if arch == "phi3" and cfg.rope_parameters.get("rope_type") == "longrope":
        writer.add_rope_scaling_orig_ctx_len(cfg.rope_parameters["original_max_position_embeddings"])
        writer.add_tensor("rope_factors_long.weight", np.asarray(cfg.rope_parameters["long_factor"], np.float32))
        writer.add_tensor("rope_factors_short.weight", np.asarray(cfg.rope_parameters["short_factor"], np.float32))


# A tiny Llama with the default model's vocabulary and tokenizer: text prompts, stop strings, the chat template
# and the openai client all work, while it loads and compiles in seconds.
TOKENIZER_MODEL_CONFIG = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=49152, hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
    hidden_act="silu", torch_dtype="float32")


def save_tiny_model_with_tokenizer(directory: Path) -> Path:
    """config.json + model.safetensors (random weights) + the default model's tokenizer files."""
    import json

    from safetensors.numpy import save_file

    from jaxllm.loaders import resolve_model
    from jaxllm.tokenizer import load_tokenizer

    (directory / "config.json").write_text(json.dumps(TOKENIZER_MODEL_CONFIG))
    save_file(_tiny_llama_weights(TOKENIZER_MODEL_CONFIG), str(directory / "model.safetensors"))
    load_tokenizer(resolve_model(None)).save_pretrained(str(directory))
    return directory


def _tiny_llama_weights(config: dict, seed: int = 0) -> dict:
    import numpy as np

    rng = np.random.default_rng(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * hidden // config["num_attention_heads"]

    def normal(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden),
               "model.norm.weight": np.ones(hidden, np.float32)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights.update({p + "input_layernorm.weight": np.ones(hidden, np.float32),
                        p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
                        p + "self_attn.q_proj.weight": normal(hidden, hidden),
                        p + "self_attn.k_proj.weight": normal(kv, hidden),
                        p + "self_attn.v_proj.weight": normal(kv, hidden),
                        p + "self_attn.o_proj.weight": normal(hidden, hidden),
                        p + "mlp.gate_proj.weight": normal(inter, hidden),
                        p + "mlp.up_proj.weight": normal(inter, hidden),
                        p + "mlp.down_proj.weight": normal(hidden, inter)})
    return weights


def byte_tokenizer():
    """A byte-level tokenizer without merges: exactly 256 ids, the tiny models' vocabulary size."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)
