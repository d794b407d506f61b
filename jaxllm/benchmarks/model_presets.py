"""Model shapes for benchmarks on machines without the weights: ModelConfigs to pair with random_params.

The shapes are those of the published Hugging Face config.json files; "tiny" is a ~2 MiB model for tests.
"""

from __future__ import annotations

from jaxllm.config import Llama3RopeScaling, ModelConfig

MODEL_PRESETS: dict[str, ModelConfig] = {
    # meta-llama/Meta-Llama-3-8B: 8.03e9 params
    "llama3-8b": ModelConfig(
        architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
        max_position_embeddings=8192, tie_word_embeddings=False, bos_token_id=128000, eos_token_ids=(128001,)),
    # meta-llama/Llama-3.2-1B: 1.24e9 params, tied embeddings, Llama 3.1 rope scaling
    "llama3.2-1b": ModelConfig(
        architecture="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
        num_heads=32, num_kv_heads=8, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=Llama3RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=8192),
        max_position_embeddings=131072, tie_word_embeddings=True, bos_token_id=128000, eos_token_ids=(128001,)),
    # HuggingFaceTB/SmolLM2-135M(-Instruct): 1.35e8 params, the default model's shapes
    "smollm2-135m": ModelConfig(
        architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
        num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0,
        max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,)),
    # Qwen/Qwen3-30B-A3B: 30.5e9 params, 3.3e9 active (every layer sparse: 128 experts of width 768, 8 per token)
    "qwen3-30b-a3b": ModelConfig(
        architecture="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=48,
        num_heads=32, num_kv_heads=4, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=40960, tie_word_embeddings=False, bos_token_id=151643, eos_token_ids=(151645,),
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True),
    # tests: 2 layers, GQA 2, untied head, 0.56e6 params
    "tiny": ModelConfig(
        architecture="llama", vocab_size=1024, hidden_size=128, intermediate_size=256, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=512, tie_word_embeddings=False),
    # tests: Qwen2-MoE-shaped, layer 0 sparse (8 experts of width 32, 2 per token, a shared expert of 48), layer 1
    # dense (intermediate 128), untied head
    "tiny-moe": ModelConfig(
        architecture="qwen2_moe", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False,
        shared_expert_intermediate_size=48, dense_layers=(1,)),
}


def model_preset(name: str) -> ModelConfig:
    if name not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(MODEL_PRESETS)}")
    return MODEL_PRESETS[name]
