// Exp16: exp on 16 float32 lanes (AVX-512), shared by the native CPU kernels.
#ifndef JAXLLM_PALLAS_KERNELS_EXP16_H_
#define JAXLLM_PALLAS_KERNELS_EXP16_H_

#ifdef __AVX512F__
#include <immintrin.h>

#include <initializer_list>

namespace jaxllm {

// exp(x) for x clamped to [lo, hi]: 2^k p(r) with x = k ln2 + r, ln2 split in two (the fused multiply-adds keep
// the split exact) and p of degree 7; within 1e-7 of exp relative, as the C library's is. The attention kernel's
// scores minus their maximum take [-87, 0] (exp(-87) ~ 2^-125.5, the smallest normal's neighbourhood); the SiLU
// kernel takes [-87.3, 89] (above 88.73 the scale by 2^k overflows to inf, as float32's exp does). A NaN lane
// comes out as exp(lo).
inline __m512 Exp16(__m512 x, float lo, float hi) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(lo)), _mm512_set1_ps(hi));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(k, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, k);
}

}  // namespace jaxllm

#endif  // __AVX512F__
#endif  // JAXLLM_PALLAS_KERNELS_EXP16_H_
