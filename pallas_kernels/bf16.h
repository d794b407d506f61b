// bfloat16 <-> float32 for the native CPU kernels: scalar, and 16 lanes at a time where AVX512-BF16 is present.
#ifndef JAXLLM_PALLAS_KERNELS_BF16_H_
#define JAXLLM_PALLAS_KERNELS_BF16_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace jaxllm {

inline float Bf16ToFloat(uint16_t bits) {  // the high half of the float
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &wide, sizeof(x));
  return x;
}

inline uint16_t FloatToBf16(float x) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

#ifdef __AVX512F__
inline __m512 Widen16(__m256i bf16) {  // 16 bfloat16 -> float32 (AVX-512F alone)
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16), 16));
}

// FloatToBf16 on 16 lanes, bit for bit (AVX-512F and BW alone): round to nearest even, NaN stays NaN.
inline __m256i RoundToBf16x16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(rounded);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
inline __m256i Narrow16(__m512 x) {  // 16 float32 -> bfloat16, to nearest even
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
}
#endif

}  // namespace jaxllm

#endif  // JAXLLM_PALLAS_KERNELS_BF16_H_
