// Intel AMX for the native CPU kernels: the tile state's grant and a tile configuration (tile B's operands are
// packed by pairs16.h). JAXLLM_AMX is defined where the build targets AMX-BF16 (and AVX512-BF16).
#ifndef JAXLLM_PALLAS_KERNELS_AMX_H_
#define JAXLLM_PALLAS_KERNELS_AMX_H_

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#define JAXLLM_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

#include "pairs16.h"

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

}  // namespace jaxllm

#endif  // AMX-BF16 and AVX512-BF16
#endif  // JAXLLM_PALLAS_KERNELS_AMX_H_
