// Dense bfloat16 matmul on Intel AMX tiles, as an XLA FFI handler, over a weight stored as AMX tiles.
//
// The contract is reference.py's `tiled_dot` (tested against it):
//
//   x [M, K] bfloat16, tiles [N/32, K/32, 2, 16, 32] bfloat16 (reference.py's `pack_tiles` of a weight w [N, K])
//   ->  out [M, N] float32, out[m, n] = sum_k x[m, k] * w[n, k], products exact, summed in float32.
//
// AMX's TDPBF16PS multiplies a tile A [16 rows, 32 bfloat16] by a tile B [16 pairs of rows, 16 columns, 2 bfloat16]
// into a float32 tile C [16, 16]. tiles[b, s, h] is the A tile w[32b + 16h .. +16, 32s .. +32], its 16 rows of 64
// bytes in a row, so a block of 32 weight rows is one contiguous run that the kernel reads front to back (the
// prefetchers see one stream; the next block is prefetched while this one is used). It computes C^T = w x^T: the
// activations are repacked, once a call, into xp [K/2, Mp] pairs (x[m, 2p], x[m, 2p+1]) with Mp = M rounded up to
// the activation block (16 rows for M <= 16, else 32) and zero rows, which is B's layout. A work item takes a run
// of weight blocks; for each, every activation block: the weight block's two A tiles times the block's one or two
// B tiles into two or four C tiles over K, each C^T tile then transposed in registers and stored into out.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx.h"
#include "parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kRows = 32;              // weight rows per block: two A tiles
constexpr int64_t kStepElems = 2 * 16 * 32;  // one 32-column step of a block: two 16 x 32 A tiles
constexpr int64_t kMinItemBytes = 1 << 17;  // weight bytes of one work item at least

#ifdef JAXLLM_AMX

using jaxllm::PackPairs;
using jaxllm::TilesGranted;
using jaxllm::Transpose16;

// Tiles 0-3: C (float32 16 x 16); 4, 5: A (weight rows); 6, 7: B (activation pairs). Each 16 rows x 64 bytes.
void ConfigureTiles() {
  jaxllm::TileConfig config;
  for (int t = 0; t < 8; ++t) config.Set(t, 16, 64);
  _tile_loadconfig(&config);
}

// ct [16 n, 16 m] (C^T, rows 64 bytes apart) -> out[j, 0 .. 16] for the j < rows valid rows (out rows N apart).
inline void StoreTransposed(const float* ct, int64_t rows, int64_t N, float* out) {
  if (rows <= 0) return;
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(ct + 16 * i);
  Transpose16(r);
  for (int j = 0; j < rows; ++j) _mm512_storeu_ps(out + j * N, r[j]);
}

// Step k_step of the next weight block (its two tiles, 2 KiB), asked for (prefetcht1) while step k_step of this
// block runs: the whole next block is in flight by this one's end.
inline void PrefetchStep(const uint16_t* next_block, int64_t k_step) {
  if (next_block == nullptr) return;
  const char* step = reinterpret_cast<const char*>(next_block + k_step * kStepElems);
  for (int64_t line = 0; line < kStepElems * static_cast<int64_t>(sizeof(uint16_t)); line += 64)
    _mm_prefetch(step + line, _MM_HINT_T1);
}

// out[m0 .. m0 + rows_in_block, 0 .. 32] (out already offset to the block's first column) for the activation
// blocks m_begin .. m_end of kMb rows (16: one B tile; 32: two): `block` is the weight block [K/32, 2, 16, 32].
template <int kMb>
void WeightBlock(const uint16_t* block, const uint16_t* next_block, const uint32_t* xp, int64_t m_begin,
                 int64_t m_end, int64_t M, int64_t K, int64_t N, int64_t Mp, float* out) {
  alignas(64) float ct[4][16 * 16];
  const int64_t x_stride = Mp * sizeof(uint32_t), steps = K / 32;
  for (int64_t m0 = m_begin; m0 < m_end; m0 += kMb) {
    _tile_zero(0);
    _tile_zero(2);
    if constexpr (kMb == 32) {
      _tile_zero(1);
      _tile_zero(3);
    }
    for (int64_t s = 0; s < steps; ++s) {
      if (m0 == m_begin) PrefetchStep(next_block, s);
      const uint16_t* a = block + s * kStepElems;
      _tile_loadd(4, a, 64);            // weight rows 0 .. 16 of the block, columns 32s .. 32s + 32
      _tile_loadd(5, a + kStepElems / 2, 64);  // rows 16 .. 32
      _tile_loadd(6, xp + s * 16 * Mp + m0, x_stride);  // pairs 16s .. 16s + 16 of activation rows m0 .. m0 + 16
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (kMb == 32) {
        _tile_loadd(7, xp + s * 16 * Mp + m0 + 16, x_stride);  // of rows m0 + 16 .. m0 + 32
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, ct[0], 64);
    _tile_stored(2, ct[2], 64);
    const int64_t low = std::clamp<int64_t>(M - m0, 0, 16);
    float* at = out + m0 * N;
    StoreTransposed(ct[0], low, N, at);
    StoreTransposed(ct[2], low, N, at + 16);
    if constexpr (kMb == 32) {
      _tile_stored(1, ct[1], 64);
      _tile_stored(3, ct[3], 64);
      const int64_t high = std::clamp<int64_t>(M - m0 - 16, 0, 16);
      StoreTransposed(ct[1], high, N, at + 16 * N);
      StoreTransposed(ct[3], high, N, at + 16 * N + 16);
    }
  }
}

template <int kMb>
void TiledMatmul(ffi::ThreadPool& pool, const uint16_t* x, const uint16_t* tiles, int64_t M, int64_t K, int64_t N,
                 float* out) {
  const int64_t Mp = (M + kMb - 1) / kMb * kMb;
  std::vector<uint32_t> xp(static_cast<size_t>(K / 2 * Mp));
  PackPairs(x, M, K, Mp, xp.data());
  // units of work: (weight block, activation block), weight-block-major so that an item's units share weights
  const int64_t blocks = N / kRows, row_blocks = Mp / kMb, units = blocks * row_blocks;
  const int64_t block_elems = kRows * K, unit_bytes = block_elems * sizeof(uint16_t) * std::min<int64_t>(row_blocks, 2);
  const int64_t max_items = 4 * (pool.num_threads() + 1);
  const int64_t items = std::clamp<int64_t>(units * unit_bytes / kMinItemBytes, 1, std::min(units, max_items));
  const uint32_t* packed = xp.data();
  jaxllm::ParallelFor(pool, items, [=](int64_t i) {
    ConfigureTiles();  // tile state is per thread
    const int64_t end = (i + 1) * units / items;
    for (int64_t u = i * units / items; u < end;) {
      const int64_t b = u / row_blocks, r = u % row_blocks, run = std::min(row_blocks - r, end - u);
      const bool next_is_mine = b + 1 < blocks && (b + 1) * row_blocks < end;  // this item also reads block b + 1
      WeightBlock<kMb>(tiles + b * block_elems, next_is_mine ? tiles + (b + 1) * block_elems : nullptr, packed,
                       r * kMb, (r + run) * kMb, M, K, N, Mp, out + b * kRows);
      u += run;
    }
    _tile_release();
  });
}

#endif  // JAXLLM_AMX

ffi::Error TiledMatmulHandler(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> tiles,
                              ffi::ResultBuffer<ffi::F32> out) {
  const auto xd = x.dimensions(), td = tiles.dimensions();
  if (xd.size() != 2 || td.size() != 5 || td[2] != 2 || td[3] != 16 || td[4] != 32 || xd[1] != td[1] * 32)
    return ffi::Error::InvalidArgument("x must be [M, K] and tiles [N/32, K/32, 2, 16, 32]");
  const int64_t M = xd[0], K = xd[1], N = td[0] * kRows;
#ifdef JAXLLM_AMX
  if (!TilesGranted()) return ffi::Error::Internal("the operating system did not grant AMX tile state");
  const auto* xs = reinterpret_cast<const uint16_t*>(x.typed_data());
  const auto* ws = reinterpret_cast<const uint16_t*>(tiles.typed_data());
  if (M > 16) {
    TiledMatmul<32>(pool, xs, ws, M, K, N, out->typed_data());
  } else if (M > 0) {
    TiledMatmul<16>(pool, xs, ws, M, K, N, out->typed_data());
  }
  return ffi::Error::Success();
#else
  return ffi::Error::Internal("built without AMX (this CPU or compiler lacks AMX-BF16)");
#endif
}

}  // namespace

// 1 where this build has AMX and the operating system grants its tile state to this process, else 0.
extern "C" int JaxllmAmxReady() {
#ifdef JAXLLM_AMX
  return TilesGranted() ? 1 : 0;
#else
  return 0;
#endif
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxllmTiledMatmul, TiledMatmulHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // tiles [N/32, K/32, 2, 16, 32]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // out [M, N]
);
