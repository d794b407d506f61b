// SiLU and product of the gated MLP (SwiGLU) for the CPU, bfloat16, as an XLA FFI handler.
//
// The contract is reference.py's (which this is tested against):
//
//   gate_up [T, 2F] float32 (the gate_up projection's float32 sums: gate columns, then up)  ->  out [T, F] bfloat16,
//   out = bf16(bf16(silu(g)) * u), g = bf16(gate), u = bf16(up), silu(g) = g * (1 / (1 + exp(-g))), in float32:
//   the model's bfloat16 projection output, activation and product, each rounded once.
//
// XLA:CPU's exp costs ~1 ns an element on the 2-core machines (the bfloat16 SiLU and product of a batch-64
// decode step's [64, 1536] gate: ~145 us; benchmarks/RESULTS.md). Here 16 lanes at a time (silu16.h, which the AMX
// gate|up kernel's epilogue shares): exp16.h's 2^k p(r) with a degree-7 polynomial (within 1e-7 relative, as the C
// library's), the division exact, round to nearest even.
// Rows run on XLA's intra-op thread pool and the calling thread.

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "bf16.h"
#include "parallel_for.h"
#include "silu16.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMinItemElements = 1 << 14;  // output elements of one work item at least

#if defined(__AVX512F__) && defined(__AVX512BF16__)

void Row(const float* gate, const float* up, uint16_t* out, int64_t F) {
  for (int64_t i = 0; i < F; i += 16) {
    const __mmask16 valid = F - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (F - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(valid, gate + i), u = _mm512_maskz_loadu_ps(valid, up + i);
    _mm256_mask_storeu_epi16(out + i, valid, jaxllm::SiluMul16(g, u));
  }
}

#else

using jaxllm::Bf16ToFloat;
using jaxllm::FloatToBf16;

void Row(const float* gate, const float* up, uint16_t* out, int64_t F) {
  for (int64_t i = 0; i < F; ++i) {
    const float g = Bf16ToFloat(FloatToBf16(gate[i])), u = Bf16ToFloat(FloatToBf16(up[i]));
    out[i] = FloatToBf16(Bf16ToFloat(FloatToBf16(g * (1.0f / (1.0f + std::exp(-g))))) * u);
  }
}

#endif

ffi::Error SiluAndMul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> gate_up, ffi::ResultBuffer<ffi::BF16> out) {
  const auto dims = gate_up.dimensions();
  if (dims.size() != 2 || dims[1] % 2 != 0) return ffi::Error::InvalidArgument("gate_up must be [T, 2F]");
  const int64_t T = dims[0], F = dims[1] / 2;
  const float* in = gate_up.typed_data();
  uint16_t* result = reinterpret_cast<uint16_t*>(out->untyped_data());
  const int64_t rows_per_item = std::max<int64_t>(1, kMinItemElements / std::max<int64_t>(F, 1));
  const int64_t items = (T + rows_per_item - 1) / rows_per_item;
  jaxllm::ParallelFor(pool, items, [=](int64_t i) {
    for (int64_t t = i * rows_per_item; t < std::min(T, (i + 1) * rows_per_item); ++t)
      Row(in + t * 2 * F, in + t * 2 * F + F, result + t * F, F);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxllmSiluAndMul, SiluAndMul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // gate_up [T, 2F]
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // out [T, F]
);
