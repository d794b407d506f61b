"""The mixture-of-experts keys of a Hugging Face config.json, read with Hugging Face's semantics.

    family      experts E                       k                    expert width        renormalize top-k
    mixtral     num_local_experts               num_experts_per_tok  intermediate_size   always
    qwen2_moe   num_experts (num_local_experts) num_experts_per_tok  moe_intermediate    norm_topk_prob (false)
    qwen3_moe   num_experts (num_local_experts) num_experts_per_tok  moe_intermediate    norm_topk_prob (false)

Qwen's layer i is sparse iff i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0; the others run
the dense MLP of intermediate_size. Qwen2-MoE adds a shared expert of shared_expert_intermediate_size.
"""

from __future__ import annotations

from jaxllm.architecture import Architecture
from jaxllm.file_fields import FieldReader, short_repr


def read_moe_fields(r: FieldReader, arch: Architecture, num_layers: int) -> dict:
    """ModelConfig's expert fields for `arch` ({} for a dense family); a bad key is a ModelLoadError naming it."""
    if not arch.experts:
        return {}
    if arch.name == "mixtral":
        experts = r.integer("num_local_experts", 8)
        return dict(num_experts=experts, num_experts_per_tok=_top_k(r, experts, 2),
                    moe_intermediate_size=r.integer("intermediate_size"), norm_topk_prob=True)
    key = "num_experts" if r.has("num_experts") else "num_local_experts"
    experts = r.integer(key, 60 if arch.name == "qwen2_moe" else 128)
    return dict(num_experts=experts, num_experts_per_tok=_top_k(r, experts, 4 if arch.name == "qwen2_moe" else 8),
                moe_intermediate_size=r.integer("moe_intermediate_size"),
                norm_topk_prob=r.flag("norm_topk_prob", False),
                shared_expert_intermediate_size=r.integer("shared_expert_intermediate_size")
                if arch.shared_expert else 0,
                dense_layers=_dense_layers(r, num_layers))


def _top_k(r: FieldReader, experts: int, default: int) -> int:
    return r.integer("num_experts_per_tok", default, maximum=experts)


MAX_LAYERS_WITH_SPARSE_STEP = 10_000  # a step > 1 lists the dense layers one by one


def _dense_layers(r: FieldReader, num_layers: int) -> tuple[int, ...]:
    """The layers HF builds with a dense MLP: those in mlp_only_layers, and those decoder_sparse_step skips."""
    only = r.raw("mlp_only_layers", [])
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers
                                             for i in only):
        raise r.error("mlp_only_layers", f"must be a list of layer indices below {num_layers}, got {short_repr(only)}")
    step = r.integer("decoder_sparse_step", 1)
    if step == 1:
        return tuple(sorted(set(only)))
    if num_layers > MAX_LAYERS_WITH_SPARSE_STEP:
        raise r.error("decoder_sparse_step", f"{step} with num_hidden_layers {num_layers}: more layers than "
                                             f"{MAX_LAYERS_WITH_SPARSE_STEP} are not supported with a sparse step")
    return tuple(i for i in range(num_layers) if i in only or (i + 1) % step)
