"""Weight quantization: AWQ (activation-aware, Lin et al. 2023) and round-to-nearest int4, written as AutoAWQ
GEMM checkpoints (`jaxllm quantize`).

    awq_format.py        the checkpoint's packing: pack_awq / unpack_awq / dequantize_awq (numpy)
    group_quant.py       asymmetric 4-bit group quantization (jnp)
    dense_forward.py     a per-layer forward over whole sequences, exposing each linear group's input; loaded
                         params -> per-layer float dicts, q/k/v and gate/up apart
    search.py            each group's calibration statistics (Gram matrix, mean |x|); AWQ's scale and clip searches
    awq_layer.py         one layer: scale groups, folding, clipping, quantization (or RTN)
    calibration.py       calibration / held-out text -> token sequences (calibration.txt, held_out.txt)
    checkpoint.py        tensor names; writing the tensors, config.json (quantization_config) and
                         generation_config.json; reading back dequantized
    quantize.py          quantize_model: the whole pipeline
    command.py           the flags of `jaxllm quantize`
    quality.py           perplexity of float weights; float32 vs AWQ vs RTN held-out perplexity
"""

from jaxllm.quantization.awq_format import dequantize_awq, pack_awq, unpack_awq

__all__ = ["pack_awq", "unpack_awq", "dequantize_awq"]
