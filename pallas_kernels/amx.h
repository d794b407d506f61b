// Intel AMX for the native CPU kernels: the tile state's grant, a tile configuration, and operands packed in
// pairs for tile B. JAXLLM_AMX is defined where the build targets AMX-BF16 (and AVX512-BF16).
#ifndef JAXLLM_PALLAS_KERNELS_AMX_H_
#define JAXLLM_PALLAS_KERNELS_AMX_H_

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#define JAXLLM_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

#include "transpose16.h"

namespace jaxllm {

// Linux hands a process AMX's tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA).
inline bool RequestTiles() {
  constexpr int kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

// Whether this process may use the tiles (asked once).
inline bool TilesGranted() {
  static const bool granted = RequestTiles();
  return granted;
}

// Palette 1's configuration: tile t has rows[t] rows of bytes_per_row[t] bytes (unset tiles: none). Loaded per
// thread (_tile_loadconfig), since tile state is per thread.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};

  TileConfig& Set(int tile, int num_rows, int row_bytes) {
    rows[tile] = static_cast<uint8_t>(num_rows);
    bytes_per_row[tile] = static_cast<uint16_t>(row_bytes);
    return *this;
  }
};

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

#endif  // AMX-BF16 and AVX512-BF16
#endif  // JAXLLM_PALLAS_KERNELS_AMX_H_
