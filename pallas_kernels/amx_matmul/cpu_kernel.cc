// Dense bfloat16 matmul over a weight stored as AMX tiles, as an XLA FFI handler: on Intel AMX, or with AVX512-BF16's
// VDPBF16PS where the CPU has no AMX (AMD Zen 4, for one).
//
// The contract is reference.py's `tiled_dot` (tested against it):
//
//   x [M, K] bfloat16, tiles [N/32, K/32, 2, 16, 32] bfloat16 (reference.py's `pack_tiles` of a weight w [N, K])
//   ->  out [M, N] float32, out[m, n] = sum_k x[m, k] * w[n, k], products exact, summed in float32,
//
// for the rows m < live_rows (an int32 scalar operand, clamped to [0, M]); the rows from live_rows on are a shape
// bucket's padding (the step's tokens end there): not computed, written as zeros. A second target stores the sums
// rounded to bfloat16 (out [M, N] bfloat16, bit for bit XLA's convert of the float32 result).
//
// AMX's TDPBF16PS multiplies a tile A [16 rows, 32 bfloat16] by a tile B [16 pairs of rows, 16 columns, 2 bfloat16]
// into a float32 tile C [16, 16]. tiles[b, s, h] is the A tile w[32b + 16h .. +16, 32s .. +32], its 16 rows of 64
// bytes in a row, so a block of 32 weight rows is one contiguous run that the kernel reads front to back (the
// prefetchers see one stream; the next block is prefetched while this one is used). It computes C^T = w x^T: the
// activations are repacked, once a call, into pairs (x[m, 2p], x[m, 2p+1]), B's layout, an activation block (16 rows
// for M <= 16, else 32; zero rows past M) after another: xp [Mp/kMb, K/2, kMb]. Each thread takes a run
// of weight blocks (ForEachBlock); for each, every activation block: the weight block's two A tiles times the
// block's one or two B tiles into two or four C tiles over K, each C^T tile then transposed in registers and stored
// into out.
//
// Without AMX the same C^T tiles are summed with AVX512-BF16's VDPBF16PS (each pair's two products exact, summed in
// float32): a group of weight rows at a time, 16 accumulators of 16 activation rows, each weight pair broadcast from
// the tile against one or two vectors of activation pairs (RowGroupSums). Everything around the sums is shared.
//
// A third handler fuses the gated MLP's SiLU and product into the gate|up projection (the contract of
// silu_and_mul/reference.py's "silu" on tiled_dot's sums rounded to bfloat16):
//
//   x [M, K] bfloat16, tiles of w_gate_up [2F, K] (gate rows, then up rows; F a multiple of 32)
//   ->  out [M, F] bfloat16 = silu(gate) * up, rounded as silu16.h says (zeros from live_rows on),
//
// gate block j and up block j (two streams of weights) taken together, against each activation block, whose
// float32 sums stay in L1 until the epilogue writes the bfloat16 product: no [M, 2F] float32 sums in memory and no
// second pass over them.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "amx.h"
#include "pairs16.h"
#include "parallel_for.h"
#include "silu16.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kRows = 32;              // weight rows per block: two A tiles
constexpr int64_t kStepElems = 2 * 16 * 32;  // one 32-column step of a block: two 16 x 32 A tiles
constexpr int64_t kMinThreadBytes = 1 << 17;  // weight bytes a thread at least

#if defined(JAXLLM_AMX) || (defined(__AVX512F__) && defined(__AVX512BF16__))
#define JAXLLM_TILED_MATMUL 1  // this build multiplies the tiles: on AMX, else with AVX512-BF16's VDPBF16PS
#endif

#ifdef JAXLLM_TILED_MATMUL

using jaxllm::PackPairs;
using jaxllm::Transpose16;

inline void Store16(float* at, __m512 sums) { _mm512_storeu_ps(at, sums); }
inline void Store16(uint16_t* at, __m512 sums) {  // rounded to bfloat16 as XLA's convert rounds: bit for bit
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(at), jaxllm::RoundToBf16x16(sums));
}

// ct [16 n, 16 m] (C^T, rows 64 bytes apart) -> out[j, 0 .. 16] for the j < rows valid rows (out rows N apart), as
// float32 sums or (Out uint16_t) rounded to bfloat16.
template <typename Out>
inline void StoreTransposed(const float* ct, int64_t rows, int64_t N, Out* out) {
  if (rows <= 0) return;
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(ct + 16 * i);
  Transpose16(r);
  for (int j = 0; j < rows; ++j) Store16(out + j * N, r[j]);
}

// Lines [first, first + count) of step k_step of the next weight block (its two tiles, 2 KiB), asked for
// (prefetcht1) while step k_step of this block runs: the whole next block is in flight by this one's end.
inline void PrefetchStep(const uint16_t* next_block, int64_t k_step, int first = 0, int count = 32) {
  if (next_block == nullptr) return;
  const char* step = reinterpret_cast<const char*>(next_block + k_step * kStepElems);
  for (int line = first; line < first + count; ++line) _mm_prefetch(step + 64 * line, _MM_HINT_T1);
}

#ifdef JAXLLM_AMX

using jaxllm::TilesGranted;

// A thread holds AMX's tile state for its run of weight blocks (ParallelRuns's Scope): tiles 0-3 C (float32
// 16 x 16), 4, 5 A (weight rows), 6, 7 B (activation pairs), each 16 rows x 64 bytes. Tile state is per thread.
struct ThreadTiles {
  ThreadTiles() {
    jaxllm::TileConfig config;
    for (int t = 0; t < 8; ++t) config.Set(t, 16, 64);
    _tile_loadconfig(&config);
  }
  ~ThreadTiles() { _tile_release(); }
};

// The float32 sums of the weight block `block` [K/32, 2, 16, 32] against an activation block's kMb rows (`xb`, its
// pairs [K/2, kMb]), as C^T tiles [16 weight rows, 16 activation rows]: ct[2h + 0] and ct[2h + 1] hold the block's
// rows 0-15 and 16-31 against the activation rows 16h .. 16h + 16, h < kMb / 16. next_block (nullptr: none) is
// asked for as the steps go.
template <int kMb>
inline void BlockSums(const uint16_t* block, const uint16_t* next_block, const uint32_t* xb, int64_t K,
                      float (*ct)[16 * 16]) {
  constexpr int64_t x_stride = kMb * sizeof(uint32_t);
  const int64_t steps = K / 32;
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kMb == 32) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t s = 0; s < steps; ++s) {
    PrefetchStep(next_block, s);
    const uint16_t* a = block + s * kStepElems;
    _tile_loadd(4, a, 64);                   // weight rows 0 .. 16 of the block, columns 32s .. 32s + 32
    _tile_loadd(5, a + kStepElems / 2, 64);  // rows 16 .. 32
    _tile_loadd(6, xb + s * 16 * kMb, x_stride);  // pairs 16s .. 16s + 16 of the activation rows 0 .. 16
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if constexpr (kMb == 32) {
      _tile_loadd(7, xb + s * 16 * kMb + 16, x_stride);  // of the rows 16 .. 32
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, ct[0], 64);
  _tile_stored(1, ct[1], 64);
  if constexpr (kMb == 32) {
    _tile_stored(2, ct[2], 64);
    _tile_stored(3, ct[3], 64);
  }
}

#else  // AVX512-BF16 without AMX

struct ThreadTiles {};  // no tile state to hold

// Weight rows 16 hw + r0 .. + R of the block against the activation block's 16 V rows (`xb`, pairs [K/2, 16 V]):
// R x V accumulators of 16 activation rows each, one weight pair broadcast against V vectors of pairs a VDPBF16PS
// each (a pair's two products exact, summed in float32), stored as rows r0 .. r0 + R of the C^T tiles ct[2v + hw].
// Part `part` of `parts` of each step of next_block (nullptr: none) is asked for as the steps go.
template <int R, int V>
inline void RowGroupSums(const uint16_t* block, int hw, int r0, const uint32_t* xb, int64_t K,
                         const uint16_t* next_block, int part, int parts, float (*ct)[16 * 16]) {
  __m512 acc[R][V];
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
  const int64_t steps = K / 32;
  for (int64_t s = 0; s < steps; ++s) {
    PrefetchStep(next_block, s, part * 32 / parts, 32 / parts);
    // row r0 + i's 16 pairs of this step lie at w + 16 i; the step's 16 pairs of the activation rows at xs
    const auto* w = reinterpret_cast<const uint32_t*>(block + s * kStepElems + hw * (kStepElems / 2) + r0 * 32);
    const uint32_t* xs = xb + s * 16 * (16 * V);
    for (int q = 0; q < 16; ++q) {
      __m512bh x[V];
      for (int v = 0; v < V; ++v) x[v] = (__m512bh)_mm512_loadu_si512(xs + (q * V + v) * 16);
      for (int i = 0; i < R; ++i) {
        const __m512bh pair = (__m512bh)_mm512_set1_epi32(static_cast<int>(w[16 * i + q]));
        for (int v = 0; v < V; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], pair, x[v]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < V; ++v) _mm512_store_ps(ct[2 * v + hw] + 16 * (r0 + i), acc[i][v]);
}

// BlockSums's contract on AMX (above), with VDPBF16PS: the block's 32 weight rows in groups of 16 / V rows, 16
// accumulators a group (kMb 32: 8 rows x 2 vectors of activation rows; 16: 16 rows x 1).
template <int kMb>
inline void BlockSums(const uint16_t* block, const uint16_t* next_block, const uint32_t* xb, int64_t K,
                      float (*ct)[16 * 16]) {
  constexpr int V = kMb / 16, R = 16 / V, parts = 32 / R;
  int part = 0;
  for (int hw = 0; hw < 2; ++hw)
    for (int r0 = 0; r0 < 16; r0 += R) RowGroupSums<R, V>(block, hw, r0, xb, K, next_block, part++, parts, ct);
}

#endif  // JAXLLM_AMX

// The activation rows (of 16) that half h of the activation block at m0 holds: M - m0 - 16h within [0, 16].
inline int64_t RowsOf(int64_t M, int64_t m0, int h) { return std::clamp<int64_t>(M - m0 - 16 * h, 0, 16); }

// The rows the activation block at m0 is packed and summed as: kMb, or 16 for a last block of 32 that holds at most
// 16 rows (half the sums: a step's live rows end there in a quarter of a bucket's range).
template <int kMb>
inline int BlockWidth(int64_t M, int64_t m0) { return kMb == 32 && M - m0 <= 16 ? 16 : kMb; }

// BlockSums over the activation block at m0, as wide as BlockWidth says.
template <int kMb>
inline void ActivationBlockSums(const uint16_t* block, const uint16_t* next_block, const uint32_t* xp, int64_t M,
                                int64_t m0, int64_t K, float (*ct)[16 * 16]) {
  if (BlockWidth<kMb>(M, m0) == 16) {
    BlockSums<16>(block, next_block, xp + m0 * (K / 2), K, ct);
  } else {
    BlockSums<kMb>(block, next_block, xp + m0 * (K / 2), K, ct);
  }
}

// out[m0 .. m0 + kMb, 0 .. 32] for every activation block m0 = 0, kMb, ... < M, out offset to the block's first
// column (rows N apart): the weight block's sums, transposed into place (Out: as StoreTransposed stores them).
template <int kMb, typename Out>
void WeightBlock(const uint16_t* block, const uint16_t* next_block, const uint32_t* xp, int64_t M, int64_t K,
                 int64_t N, Out* out) {
  alignas(64) float ct[4][16 * 16];
  for (int64_t m0 = 0; m0 < M; m0 += kMb) {
    ActivationBlockSums<kMb>(block, m0 == 0 ? next_block : nullptr, xp, M, m0, K, ct);
    for (int h = 0; h < kMb / 16; ++h) {  // a half with no rows (past M, or past a 16-wide block) stores nothing
      Out* at = out + (m0 + 16 * h) * N;
      StoreTransposed(ct[2 * h], RowsOf(M, m0, h), N, at);
      StoreTransposed(ct[2 * h + 1], RowsOf(M, m0, h), N, at + 16);
    }
  }
}

// ct [16, 16] <- its transpose (C^T's rows become activation rows).
inline void TransposeInPlace(float* ct) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(ct + 16 * i);
  Transpose16(r);
  for (int i = 0; i < 16; ++i) _mm512_store_ps(ct + 16 * i, r[i]);
}

// out[m0 .. m0 + kMb, 0 .. 32] bfloat16 = silu(gate) * up (silu16.h) for every activation block m0 < M of
// a gate block and its up block (the weight's blocks j and F/32 + j), out offset to column 32j (rows F apart).
template <int kMb>
void GatedBlock(const uint16_t* gate_block, const uint16_t* up_block, const uint16_t* next_gate,
                const uint16_t* next_up, const uint32_t* xp, int64_t M, int64_t K, int64_t F, uint16_t* out) {
  alignas(64) float gate[4][16 * 16], up[4][16 * 16];
  for (int64_t m0 = 0; m0 < M; m0 += kMb) {
    ActivationBlockSums<kMb>(gate_block, m0 == 0 ? next_gate : nullptr, xp, M, m0, K, gate);
    ActivationBlockSums<kMb>(up_block, m0 == 0 ? next_up : nullptr, xp, M, m0, K, up);
    for (int t = 0; t < kMb / 8; ++t) {  // tile t: weight rows 16 (t % 2) .. + 16 against activation rows 16 (t / 2) ..
      if (RowsOf(M, m0, t / 2) == 0) continue;  // past M, or past a 16-wide block: no sums there
      TransposeInPlace(gate[t]);
      TransposeInPlace(up[t]);
      uint16_t* at = out + (m0 + 16 * (t / 2)) * F + 16 * (t % 2);
      for (int64_t j = 0; j < RowsOf(M, m0, t / 2); ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + j * F),
                            jaxllm::SiluMul16(_mm512_load_ps(gate[t] + 16 * j), _mm512_load_ps(up[t] + 16 * j)));
    }
  }
}

// x [M, K] repacked into pairs (tile B's layout), an activation block of kMb rows after another: [Mp/kMb, K/2, kMb]
// with Mp = M rounded up to kMb rows, so that a block's B tiles are one contiguous run of rows 4 kMb bytes apart
// (in one [K/2, Mp] array, rows 4 Mp bytes apart put a B tile's 16 rows in two of L1's sets once Mp is 512); a
// last block BlockWidth makes 16 wide is [K/2, 16] at its place. They lie in the calling thread's scratch, kept
// from call to call: a fresh allocation a call (a 512-row step's pairs are 0.6-1.5 MiB) was zeroed and faulted in
// every time (the 64-row down projection 5% slower). Valid until the thread's next call.
template <int kMb>
const uint32_t* PackedActivations(const uint16_t* x, int64_t M, int64_t K) {
  thread_local std::vector<uint32_t> xp;
  const int64_t row_blocks = (M + kMb - 1) / kMb;
  const auto size = static_cast<size_t>(row_blocks * K / 2 * kMb);
  if (xp.size() < size) xp.resize(size);
  for (int64_t r = 0; r < row_blocks; ++r)
    PackPairs(x + r * kMb * K, std::min<int64_t>(kMb, M - r * kMb), K, BlockWidth<kMb>(M, r * kMb),
              xp.data() + r * kMb * (K / 2));
  return xp.data();
}

// Runs block(b, next) for the weight blocks b < blocks (each against every activation block) on XLA's intra-op
// threads and the calling thread, each thread taking a contiguous run of blocks (ParallelRuns) with its tiles
// configured; fewer threads where the call holds under kMinThreadBytes of weights a thread (block_bytes a block).
// next: the weight block this thread will likely take after b (-1: none), asked for while b is summed.
//
// A thread asks for its next block while it sums this one, so a run's blocks come warm but its first: contiguous
// runs, not a few small items a thread dealt out in turn (12 items over 18 blocks made most blocks an item's first,
// cold from memory: with the weights streamed as in a step, 1.2-1.7x a call at 16 to 64 rows).
template <typename Block>
void ForEachBlock(ffi::ThreadPool& pool, int64_t blocks, int64_t block_bytes, Block block) {
  const int64_t threads = std::clamp<int64_t>(blocks * block_bytes / kMinThreadBytes, 1, pool.num_threads());
  jaxllm::ParallelRuns<ThreadTiles>(pool, blocks, threads, block);
}

template <int kMb, typename Out>
void TiledMatmul(ffi::ThreadPool& pool, const uint16_t* x, const uint16_t* tiles, int64_t M, int64_t K, int64_t N,
                 Out* out) {
  const uint32_t* packed = PackedActivations<kMb>(x, M, K);
  const int64_t row_blocks = (M + kMb - 1) / kMb, block_elems = kRows * K;
  const int64_t block_bytes = block_elems * sizeof(uint16_t) * std::min<int64_t>(row_blocks, 2);
  ForEachBlock(pool, N / kRows, block_bytes, [=](int64_t b, int64_t next) {
    WeightBlock<kMb>(tiles + b * block_elems, next < 0 ? nullptr : tiles + next * block_elems, packed, M, K, N,
                     out + b * kRows);
  });
}

// The gate|up projection's SiLU and product: tiles of w_gate_up [2F, K] (gate rows, then up rows), F a multiple of
// 32; gate block j and up block j are taken together.
template <int kMb>
void TiledSiluMatmul(ffi::ThreadPool& pool, const uint16_t* x, const uint16_t* tiles, int64_t M, int64_t K,
                     int64_t F, uint16_t* out) {
  const uint32_t* packed = PackedActivations<kMb>(x, M, K);
  const int64_t row_blocks = (M + kMb - 1) / kMb, block_elems = kRows * K;
  const int64_t block_bytes = 2 * block_elems * sizeof(uint16_t) * std::min<int64_t>(row_blocks, 2);
  const int64_t up_offset = F / kRows * block_elems;  // up block j lies F/32 blocks after gate block j
  ForEachBlock(pool, F / kRows, block_bytes, [=](int64_t j, int64_t next) {
    const uint16_t* gate = tiles + j * block_elems;
    const uint16_t* next_gate = next < 0 ? nullptr : tiles + next * block_elems;
    GatedBlock<kMb>(gate, gate + up_offset, next_gate, next_gate == nullptr ? nullptr : next_gate + up_offset,
                    packed, M, K, F, out + j * kRows);
  });
}

#endif  // JAXLLM_TILED_MATMUL

// Why the kernel cannot take x [M, K], these tiles and live_rows here (success: it can).
ffi::Error CheckOperands(ffi::Buffer<ffi::BF16>& x, ffi::Buffer<ffi::BF16>& tiles, ffi::Buffer<ffi::S32>& live_rows) {
  const auto xd = x.dimensions(), td = tiles.dimensions();
  if (xd.size() != 2 || td.size() != 5 || td[2] != 2 || td[3] != 16 || td[4] != 32 || xd[1] != td[1] * 32)
    return ffi::Error::InvalidArgument("x must be [M, K] and tiles [N/32, K/32, 2, 16, 32]");
  if (live_rows.element_count() != 1) return ffi::Error::InvalidArgument("live_rows must be one int32");
#if defined(JAXLLM_AMX)
  if (!TilesGranted()) return ffi::Error::Internal("the operating system did not grant AMX tile state");
  return ffi::Error::Success();
#elif defined(JAXLLM_TILED_MATMUL)
  return ffi::Error::Success();
#else
  return ffi::Error::Internal("built without AMX-BF16 or AVX512-BF16 (this CPU or compiler lacks both)");
#endif
}

// The rows of x that are computed: live_rows clamped to [0, M].
int64_t LiveRows(ffi::Buffer<ffi::S32>& live_rows, int64_t M) {
  return std::clamp<int64_t>(live_rows.typed_data()[0], 0, M);
}

// The tiled matmul's float32 sums (kOut F32), or those sums rounded to bfloat16 (BF16: the rounding XLA's convert
// would do after it, in the store instead of a pass of its own).
template <ffi::DataType kOut>
ffi::Error TiledMatmulHandler(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> tiles,
                              ffi::Buffer<ffi::S32> live_rows, ffi::ResultBuffer<kOut> out) {
  if (ffi::Error error = CheckOperands(x, tiles, live_rows); error.failure()) return error;
#ifdef JAXLLM_TILED_MATMUL
  using Out = std::conditional_t<kOut == ffi::DataType::F32, float, uint16_t>;
  const int64_t M = LiveRows(live_rows, x.dimensions()[0]), K = x.dimensions()[1], N = tiles.dimensions()[0] * kRows;
  const auto* xs = reinterpret_cast<const uint16_t*>(x.typed_data());
  const auto* ws = reinterpret_cast<const uint16_t*>(tiles.typed_data());
  auto* result = reinterpret_cast<Out*>(out->untyped_data());
  if (M > 16) {
    TiledMatmul<32>(pool, xs, ws, M, K, N, result);
  } else if (M > 0) {
    TiledMatmul<16>(pool, xs, ws, M, K, N, result);
  }
  std::memset(result + M * N, 0, (x.dimensions()[0] - M) * N * sizeof(Out));  // the padding rows
#endif
  return ffi::Error::Success();
}

ffi::Error TiledSiluMatmulHandler(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> tiles,
                                  ffi::Buffer<ffi::S32> live_rows, ffi::ResultBuffer<ffi::BF16> out) {
  if (ffi::Error error = CheckOperands(x, tiles, live_rows); error.failure()) return error;
  if (tiles.dimensions()[0] % 2 != 0)
    return ffi::Error::InvalidArgument("gate|up tiles must stand for 2F rows, F a multiple of 32");
#ifdef JAXLLM_TILED_MATMUL
  const int64_t M = LiveRows(live_rows, x.dimensions()[0]), K = x.dimensions()[1];
  const int64_t F = tiles.dimensions()[0] / 2 * kRows;
  const auto* xs = reinterpret_cast<const uint16_t*>(x.typed_data());
  const auto* ws = reinterpret_cast<const uint16_t*>(tiles.typed_data());
  auto* result = reinterpret_cast<uint16_t*>(out->untyped_data());
  if (M > 16) {
    TiledSiluMatmul<32>(pool, xs, ws, M, K, F, result);
  } else if (M > 0) {
    TiledSiluMatmul<16>(pool, xs, ws, M, K, F, result);
  }
  std::memset(result + M * F, 0, (x.dimensions()[0] - M) * F * sizeof(uint16_t));  // the padding rows
#endif
  return ffi::Error::Success();
}

}  // namespace

// 1 where this build multiplies the tiles: with AVX512-BF16, or on AMX where the operating system grants its tile
// state to this process; else 0.
extern "C" int JaxllmTiledMatmulReady() {
#if defined(JAXLLM_AMX)
  return TilesGranted() ? 1 : 0;
#elif defined(JAXLLM_TILED_MATMUL)
  return 1;
#else
  return 0;
#endif
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxllmTiledMatmul, TiledMatmulHandler<ffi::DataType::F32>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // tiles [N/32, K/32, 2, 16, 32]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // live_rows []
                                  .Ret<ffi::Buffer<ffi::F32>>()   // out [M, N]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxllmTiledMatmulBf16, TiledMatmulHandler<ffi::DataType::BF16>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // tiles [N/32, K/32, 2, 16, 32]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // live_rows []
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // out [M, N]: the sums rounded
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxllmTiledSiluMatmul, TiledSiluMatmulHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // tiles [2F/32, K/32, 2, 16, 32] of w_gate_up
                                  .Arg<ffi::Buffer<ffi::S32>>()   // live_rows []
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // out [M, F]
);
