// The write of a step's new keys and values into the KV block pool, in place, as an XLA FFI handler (CPU).
//
// XLA:CPU has no bfloat16 scatter: it converts the whole pool to float32 and back around one, in every layer of
// every step. This copies each token's [Hkv, D] rows to its slot instead, for a pool of any 2- or 4-byte type;
// the pools are aliased to the results, so they are updated where they lie.
//
//   k_pool, v_pool [L, N, Hkv, B, D] (aliased to the results), layer [] int32, slot_mapping [T] int32,
//   k, v [T, Hkv, D] in the pool's dtype  ->  k_pool, v_pool with token t at block slot / B, offset slot % B

#include <cstdint>
#include <cstring>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

ffi::Error WriteKV(ffi::AnyBuffer k_pool, ffi::AnyBuffer v_pool, ffi::Buffer<ffi::S32> layer,
                   ffi::Buffer<ffi::S32> slot_mapping, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::Result<ffi::AnyBuffer> k_out, ffi::Result<ffi::AnyBuffer> v_out) {
  const auto pd = k_pool.dimensions(), kd = k.dimensions();
  if (pd.size() != 5 || kd.size() != 3 || kd[1] != pd[2] || kd[2] != pd[4])
    return ffi::Error::InvalidArgument("the pools must be [L, N, Hkv, B, D] and k, v [T, Hkv, D]");
  if (k.element_type() != k_pool.element_type() || v.element_type() != v_pool.element_type() ||
      k_pool.element_type() != v_pool.element_type())
    return ffi::Error::InvalidArgument("k, v and the pools must share one dtype");
  const int64_t num_layers = pd[0], num_blocks = pd[1], heads = pd[2], block_size = pd[3], head_dim = pd[4];
  const int64_t num_tokens = kd[0], elem = static_cast<int64_t>(ffi::ByteWidth(k.element_type()));
  if (slot_mapping.element_count() != num_tokens)
    return ffi::Error::InvalidArgument("slot_mapping must hold one slot per token");
  const int64_t l = *layer.typed_data();
  if (l < 0 || l >= num_layers) return ffi::Error::InvalidArgument("layer is not a pool layer");

  const int32_t* slots = slot_mapping.typed_data();
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (slots[t] < 0 || slots[t] >= num_blocks * block_size)
      return ffi::Error::InvalidArgument("slot_mapping[" + std::to_string(t) + "] = " + std::to_string(slots[t]) +
                                         " is not a pool slot");
  }
  const int64_t row = head_dim * elem;  // bytes of one token's head
  const struct { const char* src; char* dst; } pairs[2] = {
      {static_cast<const char*>(k.untyped_data()), static_cast<char*>(k_out->untyped_data())},
      {static_cast<const char*>(v.untyped_data()), static_cast<char*>(v_out->untyped_data())}};
  for (const auto& pair : pairs) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      const int64_t block = slots[t] / block_size, offset = slots[t] % block_size;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t slot_index = (((l * num_blocks + block) * heads + h) * block_size + offset);
        std::memcpy(pair.dst + slot_index * row, pair.src + (t * heads + h) * row, row);
      }
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxllmWriteKV, WriteKV,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()         // k_pool (aliased to the first result)
                                  .Arg<ffi::AnyBuffer>()         // v_pool (aliased to the second result)
                                  .Arg<ffi::Buffer<ffi::S32>>()  // layer
                                  .Arg<ffi::Buffer<ffi::S32>>()  // slot_mapping
                                  .Arg<ffi::AnyBuffer>()         // k
                                  .Arg<ffi::AnyBuffer>()         // v
                                  .Ret<ffi::AnyBuffer>()         // k_pool, written
                                  .Ret<ffi::AnyBuffer>()         // v_pool, written
);
