// Skinny matmul for the CPU: a few activation rows times a dense weight, as an XLA FFI handler.
//
// The contract is the jnp reference's (reference.py), which this is tested against:
//
//   x [M, K] float32, w [N, K] float32 or bfloat16 (row-major, as jaxllm stores dense weights)  ->  out [M, N]
//   float32, out[m, n] = sum_k x[m, k] * w[n, k], summed in float32, for 1 <= M <= kMaxRows
//
// w may also be a bfloat16 weight stored as AMX tiles, [N/32, K/32, 2, 16, 32] (pallas_kernels/amx_matmul's
// pack_tiles): element (n, k) then lies at (n / 32) * 32K + (k / 32) * 1024 + (n % 32) * 32 + k % 32, so each
// 16-column step of a row is still one contiguous run; only the addresses differ (the TileLayout below).
//
// XLA:CPU runs such dots well below the rate at which the weight can be read, and a one-row dot with a bfloat16
// weight converts the whole weight to float32 first. Here each weight row is read once, converted on the fly
// (bfloat16 bits << 16 are the float32 value), and multiplied into M accumulators: a block of R rows at a time,
// 16 columns per step with AVX-512 (a plain loop the compiler vectorizes elsewhere). Blocks of rows run on XLA's
// intra-op thread pool and the calling thread.

#include <algorithm>
#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxRows = 8;          // the largest M taken (the wrapper's bound)
constexpr int64_t kPrefetchRows = 4;    // rows ahead whose lines are requested while a block is read
constexpr int64_t kMinItemBytes = 1 << 16;  // weight bytes of one work item at least, so that few tiny items run

inline float ToFloat(float v) { return v; }
inline float ToFloat(uint16_t bf16) {  // bfloat16 bits -> float32: the high half of the float
  const uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// Where element (n, k) of w lies, in elements from w's start: row-major [N, K], or AMX tiles (above). A row's
// offset and a column's offset add; 16 columns from a multiple of 16 are contiguous in both.
struct RowMajor {
  int64_t K;
  int64_t Row(int64_t n) const { return n * K; }
  int64_t Column(int64_t k) const { return k; }
};
struct TileLayout {
  int64_t K;
  int64_t Row(int64_t n) const { return (n >> 5) * 32 * K + (n & 31) * 32; }
  int64_t Column(int64_t k) const { return (k >> 5) * 1024 + (k & 31); }
};

// Rows per block: R x M accumulators, R weight vectors and one x vector stay within the 32 vector registers.
constexpr int RowsPerBlock(int m) { return m <= 6 ? 4 : 3; }

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)

inline __m512 Load16(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
inline __m512 Load16(const uint16_t* p, __mmask16 mask) {  // 16 bfloat16 -> 16 float32
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// out[m, n .. n+R] for the R weight rows w[n .. n+R, :] (lying as `layout` says).
template <int M, int R, typename T, typename Layout>
inline void RowBlock(const float* x, const T* w, Layout layout, int64_t n, int64_t K, int64_t N, float* out) {
  const T* rows[R];
  const T* ahead[R];  // the rows kPrefetchRows further on (a prefetch past the end is harmless)
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    rows[r] = w + layout.Row(n + r);
    ahead[r] = w + layout.Row(n + r + kPrefetchRows);
  }
  __m512 acc[R][M];
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = K - k >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (K - k)) - 1);  // a tail: masked
    const int64_t column = layout.Column(k);
    __m512 wv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      wv[r] = Load16(rows[r] + column, mask);
      _mm_prefetch(reinterpret_cast<const char*>(ahead[r] + column), _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m512 xv = Load16(x + m * K + k, mask);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][m] = _mm512_fmadd_ps(xv, wv[r], acc[r][m]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) out[m * N + n + r] = _mm512_reduce_add_ps(acc[r][m]);
}

#else

template <int M, int R, typename T, typename Layout>
inline void RowBlock(const float* x, const T* w, Layout layout, int64_t n, int64_t K, int64_t N, float* out) {
  for (int r = 0; r < R; ++r) {
    const T* row = w + layout.Row(n + r);
    for (int m = 0; m < M; ++m) {
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) sum += x[m * K + k] * ToFloat(row[layout.Column(k)]);
      out[m * N + n + r] = sum;
    }
  }
}

#endif

// out[:, begin .. end] = x @ w[begin .. end, :].T
template <int M, typename T, typename Layout>
void RowRange(const float* x, const T* w, Layout layout, int64_t K, int64_t N, int64_t begin, int64_t end,
              float* out) {
  constexpr int R = RowsPerBlock(M);
  int64_t n = begin;
  for (; n + R <= end; n += R) RowBlock<M, R>(x, w, layout, n, K, N, out);
  for (; n < end; ++n) RowBlock<M, 1>(x, w, layout, n, K, N, out);
}

template <int M, typename T, typename Layout>
void Skinny(ffi::ThreadPool& pool, const float* x, const T* w, Layout layout, int64_t K, int64_t N, float* out) {
  const int64_t block = RowsPerBlock(M);
  const int64_t row_bytes = std::max<int64_t>(1, K * static_cast<int64_t>(sizeof(T)));
  const int64_t max_items = 4 * (pool.num_threads() + 1);  // a few per thread, for balance
  int64_t items = std::clamp<int64_t>(N * row_bytes / kMinItemBytes, 1, max_items);
  int64_t rows = (N + items - 1) / items;
  rows = (rows + block - 1) / block * block;  // whole blocks per item
  items = (N + rows - 1) / rows;
  jaxllm::ParallelFor(pool, items, [=](int64_t i) {
    RowRange<M>(x, w, layout, K, N, i * rows, std::min(N, (i + 1) * rows), out);
  });
}

template <typename T, typename Layout>
ffi::Error Dispatch(ffi::ThreadPool& pool, int64_t M, const float* x, const T* w, Layout layout, int64_t K,
                    int64_t N, float* out) {
  switch (M) {
    case 1: Skinny<1>(pool, x, w, layout, K, N, out); break;
    case 2: Skinny<2>(pool, x, w, layout, K, N, out); break;
    case 3: Skinny<3>(pool, x, w, layout, K, N, out); break;
    case 4: Skinny<4>(pool, x, w, layout, K, N, out); break;
    case 5: Skinny<5>(pool, x, w, layout, K, N, out); break;
    case 6: Skinny<6>(pool, x, w, layout, K, N, out); break;
    case 7: Skinny<7>(pool, x, w, layout, K, N, out); break;
    case 8: Skinny<8>(pool, x, w, layout, K, N, out); break;
    default: return ffi::Error::InvalidArgument("x must have 1 to 8 rows");
  }
  return ffi::Error::Success();
}

// w [N, K] row-major, or [N/32, K/32, 2, 16, 32] bfloat16 AMX tiles.
ffi::Error SkinnyMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer w,
                        ffi::ResultBuffer<ffi::F32> out) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  const bool tiles = wd.size() == 5;
  if (tiles && (wd[2] != 2 || wd[3] != 16 || wd[4] != 32 || w.element_type() != ffi::BF16))
    return ffi::Error::InvalidArgument("tiles must be bfloat16 [N/32, K/32, 2, 16, 32]");
  const int64_t N = tiles ? wd[0] * 32 : wd[0], K = tiles ? wd[1] * 32 : wd[1];
  if (xd.size() != 2 || (wd.size() != 2 && !tiles) || xd[1] != K)
    return ffi::Error::InvalidArgument("x must be [M, K] and w [N, K] or its tiles [N/32, K/32, 2, 16, 32]");
  const int64_t M = xd[0];
  if (M < 1 || M > kMaxRows) return ffi::Error::InvalidArgument("x must have 1 to 8 rows");
  const auto* bf16 = static_cast<const uint16_t*>(w.untyped_data());
  if (tiles) return Dispatch(pool, M, x.typed_data(), bf16, TileLayout{K}, K, N, out->typed_data());
  switch (w.element_type()) {
    case ffi::F32:
      return Dispatch(pool, M, x.typed_data(), static_cast<const float*>(w.untyped_data()), RowMajor{K}, K, N,
                      out->typed_data());
    case ffi::BF16:
      return Dispatch(pool, M, x.typed_data(), bf16, RowMajor{K}, K, N, out->typed_data());
    default:
      return ffi::Error::InvalidArgument("w must be float32 or bfloat16");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxllmSkinnyMatmul, SkinnyMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, K]
                                  .Arg<ffi::AnyBuffer>()         // w [N, K] or its tiles
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [M, N]
);
