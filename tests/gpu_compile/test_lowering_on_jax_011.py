"""The main suite's CUDA-lowering tests, collected again here so that they run on jax 0.11 too (the main suite runs
jax 0.10; this tier's environment has jax 0.11.2): one test definition, both jax lines."""

from tests.kernels.test_awq_matmul import test_kernels_lower_to_triton_at_llama3_8b_shapes  # noqa: F401
from tests.kernels.test_kernel_lowering import (test_awq_model_step_lowers_with_one_int4_kernel_per_linear,  # noqa: F401
                                                test_lora_model_step_lowers_with_two_lora_kernels_per_linear,
                                                test_ragged_kernel_lowers_to_triton,
                                                test_split_kv_kernel_lowers_to_triton)
from tests.kernels.test_lora_kernel import test_kernel_lowers_to_triton_at_llama3_8b_shapes  # noqa: F401
from tests.model.test_tensor_parallel import (lowering_report_fixture,  # noqa: F401  (the fixture its tests use)
                                              test_engine_step_programs_over_a_mesh_lower_for_cuda,
                                              test_sharded_step_lowers_for_cuda_with_the_triton_kernels_on_local_shapes)
