"""Int4 AWQ weights: the kernel layout (repacked from AutoAWQ checkpoints), the jnp reference and the fused
dequantize-matmul Pallas kernels tested against it."""

from pallas_kernels.awq_matmul.kernel import awq_matmul, awq_matmul_large_m, awq_matmul_small_m
from pallas_kernels.awq_matmul.layout import AWQPacked, repack, with_scale_dtype
from pallas_kernels.awq_matmul.reference import awq_matmul_reference, dequantize

__all__ = ["AWQPacked", "awq_matmul", "awq_matmul_large_m", "awq_matmul_reference", "awq_matmul_small_m",
           "dequantize", "repack", "with_scale_dtype"]
