// SiluMul16: the gated MLP's bfloat16 SiLU and product on 16 lanes (AVX-512 with AVX512-BF16), shared by the SiLU
// kernel (silu_and_mul/) and the AMX gate|up kernel's epilogue (amx_matmul/):
//
//   out = bf16(bf16(silu(g)) * u), g = bf16(gate), u = bf16(up), silu(g) = g * (1 / (1 + exp(-g))) in float32
//
// the model's bfloat16 projection output, activation and product, each rounded once to nearest even; exp16.h's exp
// over float32's whole range (below -87.3 too small for 1 + exp to see, above 88.73 it overflows to inf as float32's
// exp does), the division exact.
#ifndef JAXLLM_PALLAS_KERNELS_SILU16_H_
#define JAXLLM_PALLAS_KERNELS_SILU16_H_

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>

#include "bf16.h"
#include "exp16.h"

namespace jaxllm {

inline __m512 RoundBf16(__m512 x) {  // x rounded to bfloat16, as float32
  return Widen16(Narrow16(x));
}

inline __m256i SiluMul16(__m512 gate, __m512 up) {
  const __m512 g = RoundBf16(gate), u = RoundBf16(up), one = _mm512_set1_ps(1.0f);
  const __m512 exp_minus_g = Exp16(_mm512_sub_ps(_mm512_setzero_ps(), g), -87.3f, 89.0f);
  const __m512 silu = _mm512_mul_ps(g, _mm512_div_ps(one, _mm512_add_ps(one, exp_minus_g)));
  return Narrow16(_mm512_mul_ps(RoundBf16(silu), u));
}

}  // namespace jaxllm

#endif  // AVX-512 with AVX512-BF16
#endif  // JAXLLM_PALLAS_KERNELS_SILU16_H_
