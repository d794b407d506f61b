// PackPairs: bfloat16 rows repacked into pairs of columns, 16 rows side by side (AMX's tile B layout, and the
// layout the AVX-512 tiled matmul multiplies with VDPBF16PS), for the native CPU kernels.
#ifndef JAXLLM_PALLAS_KERNELS_PAIRS16_H_
#define JAXLLM_PALLAS_KERNELS_PAIRS16_H_

#ifdef __AVX512F__
#include <immintrin.h>

#include <cstdint>

#include "transpose16.h"

namespace jaxllm {

// xp [K/2, Mp] <- x [M, K] bfloat16 in pairs, tile B's layout: xp[p, m] = the pair (x[m, 2p], x[m, 2p + 1]) as
// one 32-bit word, rows m >= M zero (K a multiple of 32, Mp of 16): 16 x 16 blocks of words, each transposed in
// registers.
inline void PackPairs(const uint16_t* x, int64_t M, int64_t K, int64_t Mp, uint32_t* xp) {
  const int64_t pairs = K / 2;  // a multiple of 16
  const float* words = reinterpret_cast<const float*>(x);
  for (int64_t m0 = 0; m0 < Mp; m0 += 16) {
    for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = m0 + i < M ? _mm512_loadu_ps(words + (m0 + i) * pairs + p0) : _mm512_setzero_ps();
      Transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(reinterpret_cast<float*>(xp + (p0 + i) * Mp + m0), r[i]);
    }
  }
}

}  // namespace jaxllm

#endif  // __AVX512F__
#endif  // JAXLLM_PALLAS_KERNELS_PAIRS16_H_
