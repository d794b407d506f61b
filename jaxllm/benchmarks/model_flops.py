"""FLOPs of a Llama-family step counted from the config (2 per multiply-add).

Counted from the shapes, independently of XLA's own estimate (`compiled.cost_analysis()`), which does not see inside
custom calls (the attention kernels); utilization figures divide these counts by measured time.
"""

from __future__ import annotations

from jaxllm.config import ModelConfig


def linear_params_per_layer(config: ModelConfig) -> int:
    """Weights of one layer's matmuls: q|k|v, o, gate|up, down."""
    h, d = config.hidden_size, config.head_dim
    qkv = h * (config.num_heads + 2 * config.num_kv_heads) * d
    return qkv + config.num_heads * d * h + 3 * h * config.intermediate_size


def decode_step_flops(config: ModelConfig, batch_size: int, context: int, with_attention: bool = True) -> float:
    """One decode step: batch_size new tokens, each attending to `context` cached tokens plus itself, and the
    LM head on every one of them."""
    per_layer = 2 * linear_params_per_layer(config)
    if with_attention:
        per_layer += 2 * 2 * config.num_heads * config.head_dim * (context + 1)  # q.k and p.v
    lm_head = 2 * config.vocab_size * config.hidden_size
    return float(batch_size * (config.num_layers * per_layer + lm_head))
