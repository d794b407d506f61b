"""FLOPs of a step counted from the config (2 per multiply-add), dense or mixture-of-experts.

A MoE layer's MLP is the work each token routes: its k experts' gate|up and down, the router (E logits), and
Qwen2-MoE's shared expert with its gate; the other E - k experts do nothing for it.

Counted from the shapes, independently of XLA's own estimate (`compiled.cost_analysis()`), which does not see inside
custom calls (the attention and MoE kernels); utilization figures divide these counts by measured time.
"""

from __future__ import annotations

from jaxllm.config import ModelConfig


def attention_params_per_layer(config: ModelConfig) -> int:
    """Weights of one layer's attention projections: q|k|v and o."""
    h, d = config.hidden_size, config.head_dim
    return h * (config.num_heads + 2 * config.num_kv_heads) * d + config.num_heads * d * h


def mlp_params_per_token(config: ModelConfig, layer: int = 0) -> int:
    """Weights layer `layer`'s MLP multiplies for one token: the dense gate|up and down, or in a MoE layer the
    router, k experts' gate|up and down and the shared expert with its gate (where the family has one)."""
    h = config.hidden_size
    if not config.is_moe_layer(layer):
        return 3 * h * config.intermediate_size
    routed = config.num_experts_per_tok * 3 * h * config.moe_intermediate_size
    router = config.num_experts * h
    shared = 3 * h * config.shared_expert_intermediate_size + h if config.arch.shared_expert else 0  # + its gate
    return router + routed + shared


def linear_params_per_layer(config: ModelConfig, layer: int = 0) -> int:
    """Weights one token multiplies in layer `layer`: q|k|v, o and its MLP's (mlp_params_per_token)."""
    return attention_params_per_layer(config) + mlp_params_per_token(config, layer)


def decode_step_flops(config: ModelConfig, batch_size: int, context: int, with_attention: bool = True) -> float:
    """One decode step: batch_size new tokens, each attending to `context` cached tokens plus itself, and the
    LM head on every one of them."""
    per_token = sum(2 * linear_params_per_layer(config, layer) for layer in range(config.num_layers))
    if with_attention:
        per_token += config.num_layers * 2 * 2 * config.num_heads * config.head_dim * (context + 1)  # q.k, p.v
    lm_head = 2 * config.vocab_size * config.hidden_size
    return float(batch_size * (per_token + lm_head))
