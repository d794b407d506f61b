// The residual add and RMS norm of a decoder layer for the CPU, bfloat16, as an XLA FFI handler.
//
// The contract is reference.py's (which this is tested against):
//
//   x [T, H] bfloat16 (the residual stream), delta [T, H] float32 (a projection's float32 sums), weight [H]
//   bfloat16, eps  ->  sum [T, H] bfloat16, normed [T, H] bfloat16, in float32 arithmetic:
//     sum    = bf16(x + bf16(delta))                                the projection's output, then the add, rounded
//     normed = bf16(weight * bf16(sum * rsqrt(mean(sum^2) + eps)))  Llama's norm: cast back, then scale
//
// XLA:CPU runs these as five or six small loops a norm (the add, converts, a reduction, the rsqrt, the scale), each
// ~10-30 us on a batch-64 decode step's [64, 576] on the 2-core machines (benchmarks/RESULTS.md); here one pass per
// row computes the sum and its squares, a second the normed row. Rows run on XLA's intra-op thread pool and the
// calling thread, at least kMinItemElements outputs a work item.

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "bf16.h"
#include "parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMinItemElements = 1 << 14;  // outputs of one work item at least

#if defined(__AVX512F__) && defined(__AVX512BF16__)

using jaxllm::Narrow16;
using jaxllm::Widen16;

void Row(const uint16_t* x, const float* delta, const uint16_t* weight, float eps, int64_t H, uint16_t* sum,
         uint16_t* normed) {
  __m512 squares = _mm512_setzero_ps();
  for (int64_t i = 0; i < H; i += 16) {
    const __mmask16 valid = H - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (H - i)) - 1);
    const __m512 d = Widen16(Narrow16(_mm512_maskz_loadu_ps(valid, delta + i)));
    const __m256i s = Narrow16(_mm512_add_ps(Widen16(_mm256_maskz_loadu_epi16(valid, x + i)), d));
    _mm256_mask_storeu_epi16(sum + i, valid, s);
    const __m512 s32 = Widen16(s);
    squares = _mm512_fmadd_ps(s32, s32, squares);
  }
  const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / H + eps));
  for (int64_t i = 0; i < H; i += 16) {
    const __mmask16 valid = H - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (H - i)) - 1);
    const __m512 n = Widen16(Narrow16(_mm512_mul_ps(Widen16(_mm256_maskz_loadu_epi16(valid, sum + i)), scale)));
    const __m512 w = Widen16(_mm256_maskz_loadu_epi16(valid, weight + i));
    _mm256_mask_storeu_epi16(normed + i, valid, Narrow16(_mm512_mul_ps(w, n)));
  }
}

#else

using jaxllm::Bf16ToFloat;
using jaxllm::FloatToBf16;

void Row(const uint16_t* x, const float* delta, const uint16_t* weight, float eps, int64_t H, uint16_t* sum,
         uint16_t* normed) {
  float squares = 0.0f;
  for (int64_t i = 0; i < H; ++i) {
    sum[i] = FloatToBf16(Bf16ToFloat(x[i]) + Bf16ToFloat(FloatToBf16(delta[i])));
    squares += Bf16ToFloat(sum[i]) * Bf16ToFloat(sum[i]);
  }
  const float scale = 1.0f / std::sqrt(squares / H + eps);
  for (int64_t i = 0; i < H; ++i) {
    const float n = Bf16ToFloat(FloatToBf16(Bf16ToFloat(sum[i]) * scale));
    normed[i] = FloatToBf16(Bf16ToFloat(weight[i]) * n);
  }
}

#endif

ffi::Error AddRmsNorm(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::F32> delta,
                      ffi::Buffer<ffi::BF16> weight, float eps, ffi::ResultBuffer<ffi::BF16> sum,
                      ffi::ResultBuffer<ffi::BF16> normed) {
  const auto dims = x.dimensions();
  if (dims.size() != 2) return ffi::Error::InvalidArgument("x must be [T, H]");
  const int64_t T = dims[0], H = dims[1];
  if (delta.dimensions().size() != 2 || delta.dimensions()[0] != T || delta.dimensions()[1] != H)
    return ffi::Error::InvalidArgument("delta must be [T, H] as x");
  if (weight.dimensions().size() != 1 || weight.dimensions()[0] != H)
    return ffi::Error::InvalidArgument("weight must be [H]");
  const auto* xs = reinterpret_cast<const uint16_t*>(x.untyped_data());
  const float* ds = delta.typed_data();
  const auto* w = reinterpret_cast<const uint16_t*>(weight.untyped_data());
  auto* sums = reinterpret_cast<uint16_t*>(sum->untyped_data());
  auto* outs = reinterpret_cast<uint16_t*>(normed->untyped_data());
  const int64_t rows_per_item = std::max<int64_t>(1, kMinItemElements / std::max<int64_t>(H, 1));
  const int64_t items = (T + rows_per_item - 1) / rows_per_item;
  jaxllm::ParallelFor(pool, items, [=](int64_t i) {
    for (int64_t t = i * rows_per_item; t < std::min(T, (i + 1) * rows_per_item); ++t)
      Row(xs + t * H, ds + t * H, w, eps, H, sums + t * H, outs + t * H);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxllmAddRmsNorm, AddRmsNorm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // x [T, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // delta [T, H]
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // weight [H]
                                  .Attr<float>("eps")
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // sum [T, H]
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // normed [T, H]
);
