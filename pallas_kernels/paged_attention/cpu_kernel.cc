// Ragged paged attention for the CPU: an XLA FFI handler that reads K/V blocks in place in the pool.
//
// The contract is the jnp reference's (reference.py), which this is tested against:
//
//   q [T, Hq, D] float32, k_pool / v_pool [L, N, Hkv, B, D] float32 or bfloat16, layer [] int32,
//   block_tables [S, MB] int32, context_lens [S] int32, query_start_loc [S+1] int32  ->  out [T, Hq, D] float32
//   or bfloat16 (rounded to nearest even from the float32 result)
//
// Sequence s owns the query tokens query_start_loc[s] .. query_start_loc[s+1], its last q_len tokens; query i sits
// at position context_lens[s] - q_len + i and sees the keys 0 .. that position. Tokens past query_start_loc[S]
// (padding) come out as zeros. Two attributes, 0 for off: sliding_window W (the query at position p sees only
// keys p - W + 1 .. p; an item starts at the block holding its first query's first key) and logit_softcap c
// (scores = c * tanh(scores * sm_scale / c)).
//
// Work items are (sequence, KV head, query tile): a tile holds up to kQueryTile consecutive tokens of one
// sequence and the G = Hq / Hkv query heads that share the KV head, so each K/V block is read from the pool once
// per tile, where it lies, and used by every query vector of the tile while it sits in L1. Items run longest
// first on XLA's intra-op thread pool and the calling thread; each keeps an online softmax in float32. With
// AVX-512 and 16-key blocks, a decode row (a tile of one token) takes each K and V row once for all its G query
// vectors (AttendRow), and a tile of 16 query vectors or more puts one in each lane (AttendItemLanes); over a
// bfloat16 pool on a CPU with AMX-BF16 the lanes' scores and weighted sums run on AMX tiles (AttendTiles16).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"
#include "amx.h"
#include "bf16.h"
#include "exp16.h"
#include "transpose16.h"
#include "parallel_for.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kQueryTile = 32;  // query tokens per work item

struct Item {
  int64_t seq;    // sequence
  int64_t head;   // KV head
  int64_t first;  // first query of the tile, within the sequence's queries
  int64_t count;  // queries in the tile
  int64_t cost;   // keys read x query vectors, for longest-first ordering
};

struct Options {
  float sm_scale;
  int64_t sliding_window;  // 0: none
  float logit_softcap;     // 0: none
};

struct Shapes {
  int64_t num_tokens, num_q_heads, head_dim;  // q: [T, Hq, D]
  int64_t num_blocks, num_kv_heads, block_size;  // pool: [L, N, Hkv, B, D]
  int64_t max_blocks;  // block tables: [S, MB]
};

// The result [T, Hq, D], float32 or bfloat16 (each value rounded once, to nearest even).
struct Output {
  void* data;
  bool bf16;
  void Put(int64_t index, float x) const {
    if (bf16)
      static_cast<uint16_t*>(data)[index] = jaxllm::FloatToBf16(x);
    else
      static_cast<float*>(data)[index] = x;
  }
#ifdef __AVX512F__
  void Put16(int64_t index, __m512 x) const {  // 16 values at once, each as Put writes it
    if (bf16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(data) + index),
                          jaxllm::RoundToBf16x16(x));
    else
      _mm512_storeu_ps(static_cast<float*>(data) + index, x);
  }
#endif
};

inline float ToFloat(float x) { return x; }
inline float ToFloat(uint16_t bf16) { return jaxllm::Bf16ToFloat(bf16); }

// One K/V block [B, D] of one KV head, converted to float32 (a copy of the pointer for float32 pools).
template <typename T>
const float* BlockAsFloat(const T* block, int64_t n, std::vector<float>& scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return block;
  } else {
    for (int64_t i = 0; i < n; ++i) scratch[i] = ToFloat(block[i]);
    return scratch.data();
  }
}

inline float Dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];  // vectorized: built with -fassociative-math
  return sum;
}

// x[i] = exp(x[i]) for x[i] <= 0 (scores minus their running max), in a loop the compiler vectorizes:
// 2^k * p(r) with x = k ln2 + r, ln2 split in two (the fused multiply-adds keep the split exact), p of degree 7;
// within 1e-7 of exp relative, as the C library's is.
inline void ExpInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::max(x[i], -87.0f);  // exp(-87) ~ 2^-125.5: the smallest normal float's neighbourhood
    const float k = __builtin_roundf(v * 1.44269504088896341f);
    float r = __builtin_fmaf(k, -0.693359375f, v);
    r = __builtin_fmaf(k, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    x[i] = p * __builtin_bit_cast(float, (static_cast<int32_t>(k) + 127) << 23);
  }
}

// Asks for the n elements at data: into L1 (prefetcht0), or with kToL2 into L2 only (prefetcht1).
template <bool kToL2 = false, typename T>
inline void Prefetch(const T* data, int64_t n) {
  const char* bytes = reinterpret_cast<const char*>(data);
  for (int64_t offset = 0; offset < n * static_cast<int64_t>(sizeof(T)); offset += 64)
    __builtin_prefetch(bytes + offset, 0, kToL2 ? 2 : 3);
}

// Per-thread buffers, reused from item to item.
struct Scratch {
  std::vector<float> q, acc, m, denom, scores, k, v;
};

// Scores of one query vector against the first n keys of a [B, D] block.
inline void Scores(const float* q, const float* k, int64_t n, int64_t D, float* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = Dot(q, k + j * D, D);
}

// s[i] = c * tanh(s[i] / c): the soft-cap of n scores already scaled by sm_scale.
inline void SoftCap(float* s, int64_t n, float c) {
  const float inv = 1.0f / c;
  for (int64_t j = 0; j < n; ++j) s[j] = c * std::tanh(s[j] * inv);
}

// The first key the query at position pos sees: 0, or the start of its window.
inline int64_t FirstKey(int64_t pos, int64_t sliding_window) {
  return sliding_window > 0 ? std::max<int64_t>(0, pos - sliding_window + 1) : 0;
}

// One online-softmax step of a query vector over n visible keys whose scores are in s (overwritten).
inline void SoftmaxStep(float* s, const float* v, int64_t n, int64_t D, float& m, float& denom, float* acc) {
  float block_max = -INFINITY;
  for (int64_t j = 0; j < n; ++j) block_max = std::max(block_max, s[j]);
  const float m_new = std::max(m, block_max);
  const float alpha = std::exp(m - m_new);  // 0 at the first block (m = -inf)
  for (int64_t j = 0; j < n; ++j) s[j] -= m_new;
  ExpInPlace(s, n);
  float p_sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) p_sum += s[j];
  for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
  for (int64_t j = 0; j < n; ++j) {
    const float p = s[j];
    const float* row = v + j * D;
    for (int64_t d = 0; d < D; ++d) acc[d] += p * row[d];
  }
  denom = denom * alpha + p_sum;
  m = m_new;
}

#ifdef __AVX512F__
// AVX-512, for blocks of 16 keys and a head size kD that is a multiple of 16 (the common shapes): a key's dot
// product stays a vector of 16 partial sums until the block's 16 keys are reduced together (SumEach), the softmax
// runs on one vector of a block's scores, and alpha's exp is the same polynomial as the scores'.

// Lane j: the sum of v[j]'s 16 lanes (a transpose and add in three shuffle levels, 45 instructions for 16 sums).
inline __m512 SumEach(const __m512 (&v)[16]) {
  __m512 pairs[8];  // per 128-bit lane L: the lane-L partials of v[2i] and v[2i+1], interleaved
  for (int i = 0; i < 8; ++i)
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  __m512 quads[4];  // per 128-bit lane L: the lane-L sums of v[4i .. 4i+3]
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  constexpr int kEven = _MM_SHUFFLE(2, 0, 2, 0), kOdd = _MM_SHUFFLE(3, 1, 3, 1);
  const __m512 lo = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], kEven),
                                  _mm512_shuffle_f32x4(quads[0], quads[1], kOdd));
  const __m512 hi = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], kEven),
                                  _mm512_shuffle_f32x4(quads[2], quads[3], kOdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(lo, hi, kEven), _mm512_shuffle_f32x4(lo, hi, kOdd));
}

// ExpInPlace's polynomial on 16 lanes (x <= 0): exp16.h's.
inline __m512 Exp16(__m512 x) { return jaxllm::Exp16(x, -87.0f, 0.0f); }

// Scores of one scaled query vector (kD / 16 registers) against the 16 keys of a [16, kD] block.
template <int64_t kD>
inline __m512 BlockScores(const __m512 (&q)[kD / 16], const float* k) {
  __m512 partial[16];
  for (int j = 0; j < 16; ++j) {
    __m512 sum = _mm512_mul_ps(q[0], _mm512_loadu_ps(k + j * kD));
    for (int c = 1; c < kD / 16; ++c) sum = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(k + j * kD + 16 * c), sum);
    partial[j] = sum;
  }
  return SumEach(partial);
}

// One online-softmax step of a query vector over the keys `visible` (a lane mask) of a block whose scores are s.
template <int64_t kD>
inline void SoftmaxStep16(__m512 s, __mmask16 visible, const float* v, float& m, float& denom, float* acc) {
  s = _mm512_mask_blend_ps(visible, _mm512_set1_ps(-INFINITY), s);
  const float m_new = std::max(m, _mm512_reduce_max_ps(s));
  const float alpha = m == -INFINITY ? 0.0f : _mm512_cvtss_f32(Exp16(_mm512_set1_ps(m - m_new)));  // 0 at first
  const __m512 p = _mm512_maskz_mov_ps(visible, Exp16(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
  alignas(64) float p_lanes[16];
  _mm512_store_ps(p_lanes, p);
  __m512 out[kD / 16];
  const __m512 alpha_v = _mm512_set1_ps(alpha);
  for (int c = 0; c < kD / 16; ++c) out[c] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * c), alpha_v);
  for (int j = 0; j < 16; ++j) {
    if (!((visible >> j) & 1)) continue;
    const __m512 pj = _mm512_set1_ps(p_lanes[j]);
    for (int c = 0; c < kD / 16; ++c) out[c] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + j * kD + 16 * c), out[c]);
  }
  for (int c = 0; c < kD / 16; ++c) _mm512_storeu_ps(acc + 16 * c, out[c]);
  denom = denom * alpha + _mm512_reduce_add_ps(p);
  m = m_new;
}

// One query vector (scaled, kD / 16 registers' worth at qv) against the keys begin .. end-1 of a [16, kD] block.
template <int64_t kD>
inline void AttendVector16(const float* qv, const float* k, const float* v, int64_t begin, int64_t end,
                           const Options& opt, float& m, float& denom, float* acc) {
  __m512 q[kD / 16];
  for (int c = 0; c < kD / 16; ++c) q[c] = _mm512_loadu_ps(qv + 16 * c);
  __m512 s = BlockScores<kD>(q, k);
  if (opt.logit_softcap > 0.0f) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, s);
    SoftCap(lanes, 16, opt.logit_softcap);
    s = _mm512_load_ps(lanes);
  }
  const __mmask16 visible = static_cast<__mmask16>(((1u << end) - 1) & ~((1u << begin) - 1));
  SoftmaxStep16<kD>(s, visible, v, m, denom, acc);
}

// Decode rows: the G query vectors of one token and KV head attend together, kN at a time, so that each K and V
// row is loaded (and widened from bfloat16) once for all of them, from the block where it lies: no float32 copy of
// the block, and ~40% fewer instructions a block than a vector a query (benchmarks/RESULTS.md).
inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 Load16(const uint16_t* p) {
  return jaxllm::Widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Query vectors a decode row attends together: their accumulators and a widened V row stay in registers.
template <int64_t kD>
constexpr int kJointVectors = kD <= 64 ? 4 : (kD <= 128 ? 2 : 1);

// kN scaled query vectors qs [kN, kD] against the keys begin .. end-1 of a [16, kD] block (k, v where they lie);
// m, denom [kN] and acc [kN, kD] are their online softmax states. kFull: all 16 keys visible. next_k, next_v: the
// next block to be read (nullptr: none), asked for a row at a time as this block's K rows are read, so that its
// requests to memory spread over the block's work instead of leaving in one burst; bfloat16 rows into L2, float32
// rows into L1, each the faster of the two for its type (benchmarks/RESULTS.md).
template <typename T, int64_t kD, int kN, bool kFull>
inline void AttendVectorsJoint16(const float* qs, const T* k, const T* v, int64_t begin, int64_t end,
                                 const Options& opt, float* m, float* denom, float* acc, const T* next_k,
                                 const T* next_v) {
  constexpr int kC = kD / 16;
  constexpr bool kNextToL2 = sizeof(T) == 2;
  if constexpr (kFull) begin = 0, end = 16;
  __m512 s[kN];
  {
    __m512 partial[kN][16];
    for (int j = 0; j < 16; ++j) {  // every row: unwritten slots' scores are masked below
      __m512 row[kC];
      for (int c = 0; c < kC; ++c) row[c] = Load16(k + j * kD + 16 * c);
      if (next_k != nullptr) {
        Prefetch<kNextToL2>(next_k + j * kD, kD);
        Prefetch<kNextToL2>(next_v + j * kD, kD);
      }
      for (int n = 0; n < kN; ++n) {
        __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(qs + n * kD), row[0]);
        for (int c = 1; c < kC; ++c) sum = _mm512_fmadd_ps(_mm512_loadu_ps(qs + n * kD + 16 * c), row[c], sum);
        partial[n][j] = sum;
      }
    }
    for (int n = 0; n < kN; ++n) s[n] = SumEach(partial[n]);
  }
  const __mmask16 visible = static_cast<__mmask16>(((1u << end) - 1) & ~((1u << begin) - 1));
  alignas(64) float p[kN][16];
  __m512 out[kN][kC];
  for (int n = 0; n < kN; ++n) {
    if (opt.logit_softcap > 0.0f) {
      _mm512_store_ps(p[n], s[n]);
      SoftCap(p[n], 16, opt.logit_softcap);
      s[n] = _mm512_load_ps(p[n]);
    }
    const __m512 sn = _mm512_mask_blend_ps(visible, _mm512_set1_ps(-INFINITY), s[n]);
    const float m_new = std::max(m[n], _mm512_reduce_max_ps(sn));
    const float alpha = m[n] == -INFINITY ? 0.0f : _mm512_cvtss_f32(Exp16(_mm512_set1_ps(m[n] - m_new)));
    const __m512 pn = _mm512_maskz_mov_ps(visible, Exp16(_mm512_sub_ps(sn, _mm512_set1_ps(m_new))));
    _mm512_store_ps(p[n], pn);
    denom[n] = denom[n] * alpha + _mm512_reduce_add_ps(pn);
    m[n] = m_new;
    const __m512 alpha_v = _mm512_set1_ps(alpha);
    for (int c = 0; c < kC; ++c) out[n][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + n * kD + 16 * c), alpha_v);
  }
  for (int64_t j = begin; j < end; ++j) {  // visible rows only: an unwritten slot may hold anything
    __m512 row[kC];
    for (int c = 0; c < kC; ++c) row[c] = Load16(v + j * kD + 16 * c);
    for (int n = 0; n < kN; ++n) {
      const __m512 pj = _mm512_set1_ps(p[n][j]);
      for (int c = 0; c < kC; ++c) out[n][c] = _mm512_fmadd_ps(pj, row[c], out[n][c]);
    }
  }
  for (int n = 0; n < kN; ++n)
    for (int c = 0; c < kC; ++c) _mm512_storeu_ps(acc + n * kD + 16 * c, out[n][c]);
}

// The `count` (<= kN) query vectors at qs, with their states at m, denom and acc, against one block: the step
// of exactly `count` vectors, and its form for a full block where all 16 keys are visible.
template <typename T, int64_t kD, int kN = kJointVectors<kD>>
inline void AttendVectorsJoint(int64_t count, const float* qs, const T* k, const T* v, int64_t begin, int64_t end,
                               const Options& opt, float* m, float* denom, float* acc, const T* next_k,
                               const T* next_v) {
  if constexpr (kN > 1) {
    if (count < kN)
      return AttendVectorsJoint<T, kD, kN - 1>(count, qs, k, v, begin, end, opt, m, denom, acc, next_k, next_v);
  }
  if (begin == 0 && end == 16)
    AttendVectorsJoint16<T, kD, kN, true>(qs, k, v, begin, end, opt, m, denom, acc, next_k, next_v);
  else
    AttendVectorsJoint16<T, kD, kN, false>(qs, k, v, begin, end, opt, m, denom, acc, next_k, next_v);
}

// A work item of one query token (a decode row): its G query vectors against keys 0 (or its window's start) .. its
// position, kJointVectors<kD> at a time, the blocks read in place.
template <typename T, int64_t kD>
void AttendRow(const Item& item, const Shapes& sh, const float* q, const T* k_layer, const T* v_layer,
               const int32_t* tables, const int32_t* context_lens, const int32_t* starts, const Options& opt,
               const Output& out) {
  constexpr int64_t B = 16;
  constexpr int kN = kJointVectors<kD>;
  const int64_t G = sh.num_q_heads / sh.num_kv_heads;
  const int64_t token = starts[item.seq] + item.first;
  const int64_t pos = context_lens[item.seq] - (starts[item.seq + 1] - starts[item.seq]) + item.first;

  thread_local Scratch buf;
  buf.q.resize(G * kD);
  buf.acc.assign(G * kD, 0.0f);
  buf.m.assign(G, -INFINITY);
  buf.denom.assign(G, 0.0f);
  const float* src = q + (token * sh.num_q_heads + item.head * G) * kD;
  for (int64_t i = 0; i < G * kD; ++i) buf.q[i] = src[i] * opt.sm_scale;

  const int64_t first_key = FirstKey(pos, opt.sliding_window);
  const int64_t head_stride = B * kD, block_stride = sh.num_kv_heads * head_stride;
  for (int64_t b = first_key / B; b * B <= pos; ++b) {
    const int64_t block = tables[item.seq * sh.max_blocks + b];
    const T *next_k = nullptr, *next_v = nullptr;  // the next block lies anywhere in the pool
    if ((b + 1) * B <= pos) {
      const int64_t next = tables[item.seq * sh.max_blocks + b + 1] * block_stride + item.head * head_stride;
      next_k = k_layer + next;
      next_v = v_layer + next;
    }
    const T* k = k_layer + block * block_stride + item.head * head_stride;
    const T* v = v_layer + block * block_stride + item.head * head_stride;
    const int64_t begin = std::max<int64_t>(0, first_key - b * B), end = std::min(B, pos + 1 - b * B);
    for (int64_t g = 0; g < G; g += kN)  // the first group of vectors asks for the next block
      AttendVectorsJoint<T, kD>(std::min<int64_t>(kN, G - g), &buf.q[g * kD], k, v, begin, end, opt, &buf.m[g],
                                &buf.denom[g], &buf.acc[g * kD], g == 0 ? next_k : nullptr, g == 0 ? next_v : nullptr);
  }
  const int64_t dst = (token * sh.num_q_heads + item.head * G) * kD;
  for (int64_t g = 0; g < G; ++g) {
    const float inv = buf.denom[g] > 0.0f ? 1.0f / buf.denom[g] : 0.0f;
    for (int64_t d = 0; d < kD; ++d) out.Put(dst + g * kD + d, buf.acc[g * kD + d] * inv);
  }
}

// Query vectors in lanes, for tiles of many query vectors (prompt chunks): 16 query vectors at a time, one per lane,
// so a block's scores are 16 vectors S[j] (key j against every lane's query) built by broadcasting K[j, d] against
// the queries' d-th components (Q^T), with no sums across lanes; the online softmax keeps a maximum and denominator
// per lane, and the weighted sum of V accumulates as acc^T [kD, 16]. Every multiply-add is independent of its
// neighbours: ~2x fewer instructions than a vector a query and no long dependency chains (benchmarks/RESULTS.md).
constexpr int64_t kLanes = 16;

// The online-softmax step of one group of 16 query vectors (one a lane) over a block whose scores are s[j] (key j
// against every lane): the block's key j has position key0 + j and is seen by lane l when lo[l] <= key0 + j <=
// pos[l]; only the first `keys` rows of the block hold keys. Leaves p[j] (0 where unseen) in s, updates m and
// denom per lane, and returns alpha, the factor the lanes' accumulators take before this block's weighted V.
inline __m512 LanesSoftmax(__m512 (&s)[16], int64_t keys, int64_t key0, __m512i pos, __m512i lo, __m512& m,
                           __m512& denom) {
  __mmask16 visible[16];
  __m512 block_max = _mm512_set1_ps(-INFINITY);
  for (int j = 0; j < 16; ++j) {
    const __m512i key = _mm512_set1_epi32(static_cast<int32_t>(key0 + j));
    visible[j] = j < keys ? _mm512_cmple_epi32_mask(key, pos) & _mm512_cmpge_epi32_mask(key, lo) : 0;
    block_max = _mm512_mask_max_ps(block_max, visible[j], block_max, s[j]);
  }
  const __m512 m_new = _mm512_max_ps(m, block_max);
  const __mmask16 seen = _mm512_cmp_ps_mask(m_new, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);  // lanes with a key
  const __m512 m_safe = _mm512_maskz_mov_ps(seen, m_new);
  const __mmask16 had = _mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
  const __m512 alpha = _mm512_maskz_mov_ps(had, Exp16(_mm512_sub_ps(m, m_safe)));  // 0 before a lane's first key
  __m512 p_sum = _mm512_setzero_ps();
  for (int j = 0; j < 16; ++j) {
    s[j] = _mm512_maskz_mov_ps(visible[j], Exp16(_mm512_sub_ps(s[j], m_safe)));  // p[j], 0 where unseen
    p_sum = _mm512_add_ps(p_sum, s[j]);
  }
  denom = _mm512_fmadd_ps(denom, alpha, p_sum);
  m = m_new;
  return alpha;
}

// One block for one group of 16 query vectors. qt: the group's scaled queries [kD, 16]; k, v: the block [16, kD]
// in float32, its first `keys` rows holding keys (kFull: all 16); key0, pos, lo, m, denom: as LanesSoftmax's;
// acct: [kD, 16].
template <int64_t kD, bool kFull>
inline void AttendLanes16(const float* qt, const float* k, const float* v, int64_t keys, int64_t key0, __m512i pos,
                          __m512i lo, __m512& m, __m512& denom, float* acct) {
  if constexpr (kFull) keys = 16;  // a full block: the loops below unroll without a bound to test
  __m512 s[16];
  for (int j = 0; j < 16; ++j) s[j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < kD; ++d) {
    const __m512 qd = _mm512_loadu_ps(qt + d * kLanes);
    for (int j = 0; j < 16; ++j)
      if (j < keys) s[j] = _mm512_fmadd_ps(_mm512_set1_ps(k[j * kD + d]), qd, s[j]);
  }
  const __m512 alpha = LanesSoftmax(s, keys, key0, pos, lo, m, denom);
  for (int64_t d = 0; d < kD; ++d) {
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(acct + d * kLanes), alpha);
    for (int j = 0; j < 16; ++j)
      if (j < keys) acc = _mm512_fmadd_ps(s[j], _mm512_set1_ps(v[j * kD + d]), acc);
    _mm512_storeu_ps(acct + d * kLanes, acc);
  }
}

#ifdef JAXLLM_AMX
// The same step on AMX tiles, for bfloat16 pools (TDPBF16PS: bfloat16 pairs multiplied exactly, summed in float32).
// Each float32 factor goes in as a pair of bfloat16 tiles, its rounding and the rounding's remainder (hi + lo
// carries 16 of float32's 24 significant bits), so the results stay within ~1e-5 of the float32 path's:
//   scores^T [16 keys, 16 queries] = K [16, kD] Q^T: K is tile A as it lies in the pool (rows kD * 2 bytes apart),
//     Q^T tile B in pairs, qb [2 (hi, lo), kD / 2, 16] words, packed once an item;
//   acc^T [kD, 16 queries] += V^T [kD, 16 keys] P^T: V^T tile A, vt [kD, 16] bfloat16, transposed once a block
//     for all groups (keys past `keys` zero), P^T tile B in key pairs, packed here [2 (hi, lo), 8, 16] words.
// Tiles, 16 rows of 64 bytes unless said: in the scores' phase 0, 1 the scores^T of Q's hi and lo parts, 2 K,
// 3, 4 Q^T hi, lo; in P V's phase 0 .. 3 four 16-dimension slices of this block's P V, 5 V^T (16 rows of 32
// bytes), 6, 7 P^T hi, lo (8 rows). Independent tiles, so that the multiplies of one phase overlap.
inline void ConfigureAttentionTiles() {
  jaxllm::TileConfig config;
  for (int t : {0, 1, 2, 3, 4}) config.Set(t, 16, 64);
  config.Set(5, 16, 32).Set(6, 8, 64).Set(7, 8, 64);
  _tile_loadconfig(&config);
}

// qb [2, kD / 2, 16] words <- the Q^T pairs of the 16 query vectors first .. first + 16 (query(vec) [kD], scaled
// here; lanes past num_vectors zero): hi = the scaled vector rounded to bfloat16, lo = its remainder rounded, each
// part the rows [16, kD] packed in pairs.
template <int64_t kD, typename Query>
inline void PackQueryPairs(Query query, int64_t first, int64_t num_vectors, float scale, uint32_t* qb) {
  alignas(64) uint16_t rows[2][16][kD];  // hi, lo: a vector a row
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t lane = 0; lane < 16; ++lane) {
    const float* src = first + lane < num_vectors ? query(first + lane) : nullptr;
    for (int64_t c = 0; c < kD / 16; ++c) {
      const __m512 x = src != nullptr ? _mm512_mul_ps(_mm512_loadu_ps(src + 16 * c), scale_v) : _mm512_setzero_ps();
      const __m256i hi = jaxllm::Narrow16(x);
      _mm256_store_si256(reinterpret_cast<__m256i*>(&rows[0][lane][16 * c]), hi);
      _mm256_store_si256(reinterpret_cast<__m256i*>(&rows[1][lane][16 * c]),
                         jaxllm::Narrow16(_mm512_sub_ps(x, jaxllm::Widen16(hi))));
    }
  }
  jaxllm::PackPairs(&rows[0][0][0], 16, kD, 16, qb);
  jaxllm::PackPairs(&rows[1][0][0], 16, kD, 16, qb + kD / 2 * 16);
}

// vt [kD, 16] <- V^T of the block v [16, kD] (bfloat16 where it lies), rows past `keys` taken as zeros: V's rows as
// 32-bit words (pairs of dimensions), transposed 16 x 16 in registers; a word row's low halves are the even
// dimension's row of V^T, its high halves the odd one's.
template <int64_t kD>
inline void TransposeBlock(const uint16_t* v, int64_t keys, uint16_t* vt) {
  const float* words = reinterpret_cast<const float*>(v);
  for (int64_t w0 = 0; w0 < kD / 2; w0 += 16) {
    __m512 r[16];
    for (int j = 0; j < 16; ++j) r[j] = j < keys ? _mm512_loadu_ps(words + j * (kD / 2) + w0) : _mm512_setzero_ps();
    jaxllm::Transpose16(r);
    for (int i = 0; i < 16; ++i) {
      const __m512i pairs = _mm512_castps_si512(r[i]);
      uint16_t* even = vt + 2 * (w0 + i) * 16;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(even), _mm512_cvtepi32_epi16(pairs));
      const __m256i odd = _mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(even + 16), odd);
    }
  }
}

// Words (a[n], b[n]) as bfloat16 pairs, a in the low half, for the 16 lanes of a and b (rounded to nearest even).
inline __m512i PairWords(__m256i a, __m256i b) {
  return _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// One block for one group of 16 query vectors on tiles. qb: the group's Q^T pairs; k: the block's K where it lies;
// vt: its V^T; the rest as AttendLanes16's. The tiles are configured (ConfigureAttentionTiles).
template <int64_t kD>
inline void AttendTiles16(const uint32_t* qb, const uint16_t* k, const uint16_t* vt, int64_t keys, int64_t key0,
                          __m512i pos, __m512i lo, __m512& m, __m512& denom, float* acct) {
  constexpr int64_t kQPart = kD / 2 * 16;  // words of one of qb's two parts
  alignas(64) float tiles[4][16 * 16];
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t c = 0; c < kD / 32; ++c) {  // dimensions 32c .. 32c + 32
    _tile_loadd(2, k + 32 * c, kD * 2);
    _tile_loadd(3, qb + 16 * c * 16, 64);
    _tile_loadd(4, qb + kQPart + 16 * c * 16, 64);
    _tile_dpbf16ps(0, 2, 3);
    _tile_dpbf16ps(1, 2, 4);
  }
  _tile_stored(0, tiles[0], 64);
  _tile_stored(1, tiles[1], 64);
  __m512 s[16];
  for (int j = 0; j < 16; ++j)
    s[j] = _mm512_add_ps(_mm512_load_ps(tiles[0] + 16 * j), _mm512_load_ps(tiles[1] + 16 * j));
  const __m512 alpha = LanesSoftmax(s, keys, key0, pos, lo, m, denom);
  alignas(64) uint32_t pb[2][8 * 16];  // P^T in key pairs: hi, lo
  for (int p = 0; p < 8; ++p) {
    const __m256i hi_a = jaxllm::Narrow16(s[2 * p]), hi_b = jaxllm::Narrow16(s[2 * p + 1]);
    const __m256i lo_a = jaxllm::Narrow16(_mm512_sub_ps(s[2 * p], jaxllm::Widen16(hi_a)));
    const __m256i lo_b = jaxllm::Narrow16(_mm512_sub_ps(s[2 * p + 1], jaxllm::Widen16(hi_b)));
    _mm512_store_si512(pb[0] + 16 * p, PairWords(hi_a, hi_b));
    _mm512_store_si512(pb[1] + 16 * p, PairWords(lo_a, lo_b));
  }
  _tile_loadd(6, pb[0], 64);
  _tile_loadd(7, pb[1], 64);
  for (int64_t c0 = 0; c0 < kD / 16; c0 += 4) {  // dimensions 16 c0 .. 16 c0 + 64, a slice a tile
    // the four slices spelled out: the tile intrinsics are macros that take the tile number as written
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(5, vt + 16 * (c0 + 0) * 16, 32);
    _tile_dpbf16ps(0, 5, 6);
    _tile_dpbf16ps(0, 5, 7);
    _tile_loadd(5, vt + 16 * (c0 + 1) * 16, 32);
    _tile_dpbf16ps(1, 5, 6);
    _tile_dpbf16ps(1, 5, 7);
    _tile_loadd(5, vt + 16 * (c0 + 2) * 16, 32);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(2, 5, 7);
    _tile_loadd(5, vt + 16 * (c0 + 3) * 16, 32);
    _tile_dpbf16ps(3, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    _tile_stored(0, tiles[0], 64);
    _tile_stored(1, tiles[1], 64);
    _tile_stored(2, tiles[2], 64);
    _tile_stored(3, tiles[3], 64);
    for (int64_t c = 0; c < 4; ++c) {
      for (int i = 0; i < 16; ++i) {
        float* row = acct + (16 * (c0 + c) + i) * kLanes;
        _mm512_storeu_ps(row, _mm512_fmadd_ps(_mm512_loadu_ps(row), alpha, _mm512_load_ps(tiles[c] + 16 * i)));
      }
    }
  }
}
#endif  // JAXLLM_AMX
#endif  // __AVX512F__

// Attend one work item: its count x G query vectors against keys 0 (or its first query's window start) .. its last
// query's position. kD, kB: the head size and block size fixed at compile time (0: read from the shapes), so that
// the common ones get fully unrolled loops; kSimd: the AVX-512 vector step (kB 16, kD a multiple of 16).
template <typename T, int64_t kD, int64_t kB, bool kSimd = false>
void AttendItem(const Item& item, const Shapes& sh, const float* q, const T* k_layer, const T* v_layer,
                const int32_t* tables, const int32_t* context_lens, const int32_t* starts, const Options& opt,
                const Output& out) {
  const int64_t D = kD > 0 ? kD : sh.head_dim, B = kB > 0 ? kB : sh.block_size;
  const int64_t G = sh.num_q_heads / sh.num_kv_heads;
  const int64_t num_vectors = item.count * G;  // vector t * G + g: token t of the tile, query head item.head * G + g
  const int64_t q_len = starts[item.seq + 1] - starts[item.seq];
  const int64_t first_pos = context_lens[item.seq] - q_len + item.first;  // position of the tile's first query
  const int64_t kv_end = first_pos + item.count;  // keys at or past it are unseen by every query of the tile

  thread_local Scratch buf;
  buf.q.resize(num_vectors * D);
  buf.acc.assign(num_vectors * D, 0.0f);
  buf.m.assign(num_vectors, -INFINITY);
  buf.denom.assign(num_vectors, 0.0f);
  buf.scores.resize(B);
  buf.k.resize(B * D);
  buf.v.resize(B * D);
  for (int64_t t = 0; t < item.count; ++t) {
    const float* src = q + ((starts[item.seq] + item.first + t) * sh.num_q_heads + item.head * G) * D;
    for (int64_t i = 0; i < G * D; ++i) buf.q[t * G * D + i] = src[i] * opt.sm_scale;
  }

  const int64_t head_stride = B * D, block_stride = sh.num_kv_heads * head_stride;
  for (int64_t b = FirstKey(first_pos, opt.sliding_window) / B; b * B < kv_end; ++b) {
    const int64_t block = tables[item.seq * sh.max_blocks + b];
    if ((b + 1) * B < kv_end) {  // the next block lies anywhere in the pool: ask for it now
      const int64_t next = tables[item.seq * sh.max_blocks + b + 1] * block_stride + item.head * head_stride;
      Prefetch(k_layer + next, B * D);
      Prefetch(v_layer + next, B * D);
    }
    const float* k = BlockAsFloat(k_layer + block * block_stride + item.head * head_stride, B * D, buf.k);
    const float* v = BlockAsFloat(v_layer + block * block_stride + item.head * head_stride, B * D, buf.v);
    const int64_t keys = std::min(B, kv_end - b * B);  // keys of the block some query of the tile sees
    for (int64_t t = 0; t < item.count; ++t) {
      const int64_t end = std::min(keys, first_pos + t + 1 - b * B);  // causal: up to the query's position
      const int64_t begin = std::max<int64_t>(0, FirstKey(first_pos + t, opt.sliding_window) - b * B);
      const int64_t visible = end - begin;  // keys begin .. end-1 of the block
      if (visible <= 0) continue;
      for (int64_t vec = t * G; vec < (t + 1) * G; ++vec) {
        if constexpr (kSimd) {
#ifdef __AVX512F__
          static_assert(kB == 16 && kD > 0 && kD % 16 == 0, "the vector step takes 16-key blocks");
          AttendVector16<kD>(&buf.q[vec * D], k, v, begin, end, opt, buf.m[vec], buf.denom[vec], &buf.acc[vec * D]);
#endif
        } else {
          Scores(&buf.q[vec * D], k + begin * D, visible, D, buf.scores.data());
          if (opt.logit_softcap > 0.0f) SoftCap(buf.scores.data(), visible, opt.logit_softcap);
          SoftmaxStep(buf.scores.data(), v + begin * D, visible, D, buf.m[vec], buf.denom[vec], &buf.acc[vec * D]);
        }
      }
    }
  }
  for (int64_t t = 0; t < item.count; ++t) {
    const int64_t dst = ((starts[item.seq] + item.first + t) * sh.num_q_heads + item.head * G) * D;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t vec = t * G + g;
      const float inv = buf.denom[vec] > 0.0f ? 1.0f / buf.denom[vec] : 0.0f;
      for (int64_t d = 0; d < D; ++d) out.Put(dst + g * D + d, buf.acc[vec * D + d] * inv);
    }
  }
}


#ifdef __AVX512F__
// Per-thread buffers of the lanes path: per group of 16 query vectors, Q^T and acc^T [kD, 16], m, denom, the
// lanes' positions and first keys [16]; on tiles, Q^T in bfloat16 pairs [2, kD / 2, 16] (qb) and the block's V^T
// [kD, 16] (vt) instead of float32 blocks.
struct LaneScratch {
  std::vector<float> qt, acct, m, denom, k, v;
  std::vector<int32_t> pos, lo;
  std::vector<uint32_t> qb;
  std::vector<uint16_t> vt;
};

// Attend one work item of at least kLanes query vectors with the vectors in lanes (AttendLanes16, or AttendTiles16
// with kTiles): the same result as AttendItem's, the sums taken in another order. Vector t * G + g (token t of the
// tile, query head item.head * G + g) is lane (t * G + g) % 16 of group (t * G + g) / 16.
template <typename T, int64_t kD, bool kTiles = false>
void AttendItemLanes(const Item& item, const Shapes& sh, const float* q, const T* k_layer, const T* v_layer,
                     const int32_t* tables, const int32_t* context_lens, const int32_t* starts, const Options& opt,
                     const Output& out) {
  constexpr int64_t B = 16;
  const int64_t G = sh.num_q_heads / sh.num_kv_heads, num_vectors = item.count * G;
  const int64_t groups = (num_vectors + kLanes - 1) / kLanes, group_size = kD * kLanes;
  const int64_t q_len = starts[item.seq + 1] - starts[item.seq];
  const int64_t first_pos = context_lens[item.seq] - q_len + item.first;  // position of the tile's first query
  const int64_t kv_end = first_pos + item.count;

  thread_local LaneScratch buf;
  buf.acct.assign(groups * group_size, 0.0f);
  buf.m.assign(groups * kLanes, -INFINITY);
  buf.denom.assign(groups * kLanes, 0.0f);
  buf.pos.resize(groups * kLanes);  // per lane: its query's position (-1: an empty lane) and first visible key
  buf.lo.resize(groups * kLanes);
  for (int64_t vec = 0; vec < groups * kLanes; ++vec) {
    buf.pos[vec] = vec < num_vectors ? static_cast<int32_t>(first_pos + vec / G) : -1;
    buf.lo[vec] = static_cast<int32_t>(FirstKey(std::max<int32_t>(buf.pos[vec], 0), opt.sliding_window));
  }
  if constexpr (kTiles) {
    buf.qb.resize(groups * group_size);  // per group [2, kD / 2, 16] words: hi, lo
    buf.vt.resize(B * kD);
  } else {
    buf.qt.assign(groups * group_size, 0.0f);
    buf.k.resize(B * kD);
    buf.v.resize(B * kD);
  }
  auto row = [&](int64_t vec) {  // where vector t * G + g of the tile starts in q [T, Hq, kD] and in out
    const int64_t t = vec / G, g = vec % G;
    return ((starts[item.seq] + item.first + t) * sh.num_q_heads + item.head * G + g) * kD;
  };
  auto query = [&](int64_t vec) { return q + row(vec); };  // unscaled [kD]
  if constexpr (kTiles) {
#ifdef JAXLLM_AMX
    for (int64_t group = 0; group < groups; ++group)
      PackQueryPairs<kD>(query, group * kLanes, num_vectors, opt.sm_scale, &buf.qb[group * group_size]);
#endif
  } else {
    for (int64_t vec = 0; vec < num_vectors; ++vec) {
      const float* src = query(vec);
      float* dst = &buf.qt[vec / kLanes * group_size + vec % kLanes];
      for (int64_t d = 0; d < kD; ++d) dst[d * kLanes] = src[d] * opt.sm_scale;
    }
  }
#ifdef JAXLLM_AMX
  if constexpr (kTiles) ConfigureAttentionTiles();
#endif

  const int64_t head_stride = B * kD, block_stride = sh.num_kv_heads * head_stride;
  for (int64_t b = FirstKey(first_pos, opt.sliding_window) / B; b * B < kv_end; ++b) {
    const int64_t block = tables[item.seq * sh.max_blocks + b];
    if ((b + 1) * B < kv_end) {  // the next block lies anywhere in the pool: ask for it now
      const int64_t next = tables[item.seq * sh.max_blocks + b + 1] * block_stride + item.head * head_stride;
      Prefetch(k_layer + next, B * kD);
      Prefetch(v_layer + next, B * kD);
    }
    const T* k_block = k_layer + block * block_stride + item.head * head_stride;
    const T* v_block = v_layer + block * block_stride + item.head * head_stride;
    const int64_t keys = std::min(B, kv_end - b * B);  // keys of the block some query of the tile sees
    const float *k = nullptr, *v = nullptr;
    if constexpr (kTiles) {
#ifdef JAXLLM_AMX
      TransposeBlock<kD>(v_block, keys, buf.vt.data());
#endif
    } else {
      k = BlockAsFloat(k_block, B * kD, buf.k);
      v = BlockAsFloat(v_block, B * kD, buf.v);
    }
    for (int64_t group = 0; group < groups; ++group) {
      const int64_t first_vec = group * kLanes, last_vec = std::min(num_vectors, first_vec + kLanes) - 1;
      if (first_pos + last_vec / G < b * B) continue;  // every query of the group precedes the block
      if (FirstKey(first_pos + first_vec / G, opt.sliding_window) >= b * B + keys) continue;  // window past it
      __m512 m = _mm512_loadu_ps(&buf.m[group * kLanes]), denom = _mm512_loadu_ps(&buf.denom[group * kLanes]);
      const __m512i pos_v = _mm512_loadu_si512(&buf.pos[group * kLanes]);
      const __m512i lo_v = _mm512_loadu_si512(&buf.lo[group * kLanes]);
      float* acct = &buf.acct[group * group_size];
      if constexpr (kTiles) {
#ifdef JAXLLM_AMX
        AttendTiles16<kD>(&buf.qb[group * group_size], k_block, buf.vt.data(), keys, b * B, pos_v, lo_v, m, denom,
                          acct);
#endif
      } else if (keys == B) {
        AttendLanes16<kD, true>(&buf.qt[group * group_size], k, v, keys, b * B, pos_v, lo_v, m, denom, acct);
      } else {
        AttendLanes16<kD, false>(&buf.qt[group * group_size], k, v, keys, b * B, pos_v, lo_v, m, denom, acct);
      }
      _mm512_storeu_ps(&buf.m[group * kLanes], m);
      _mm512_storeu_ps(&buf.denom[group * kLanes], denom);
    }
  }
#ifdef JAXLLM_AMX
  if constexpr (kTiles) _tile_release();
#endif
  for (int64_t group = 0; group < groups; ++group) {  // acc^T [kD, 16] back to a row a vector, 16 x 16 at a time
    const __m512 denom = _mm512_loadu_ps(&buf.denom[group * kLanes]);
    const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(denom, _mm512_setzero_ps(), _CMP_GT_OQ),
                                           _mm512_set1_ps(1.0f), denom);  // 0 where a lane saw no key
    alignas(64) float inv_lanes[kLanes];
    _mm512_store_ps(inv_lanes, inv);
    for (int64_t d0 = 0; d0 < kD; d0 += 16) {
      __m512 lanes[16];
      for (int i = 0; i < 16; ++i) lanes[i] = _mm512_loadu_ps(&buf.acct[group * group_size + (d0 + i) * kLanes]);
      jaxllm::Transpose16(lanes);  // lanes[l]: lane l's dimensions d0 .. d0 + 16
      for (int64_t lane = 0; lane < kLanes && group * kLanes + lane < num_vectors; ++lane) {
        out.Put16(row(group * kLanes + lane) + d0, _mm512_mul_ps(lanes[lane], _mm512_set1_ps(inv_lanes[lane])));
      }
    }
  }
}

// The AVX-512 step of an item: query vectors in lanes for a tile of at least kLanes of them (prompt chunks) without
// a soft-cap, else a vector a query (decode rows: G query vectors a KV head).
template <typename T, int64_t kD>
void AttendItemSimd(const Item& item, const Shapes& sh, const float* q, const T* k_layer, const T* v_layer,
                    const int32_t* tables, const int32_t* context_lens, const int32_t* starts, const Options& opt,
                    const Output& out) {
  if (item.count * (sh.num_q_heads / sh.num_kv_heads) >= kLanes && opt.logit_softcap == 0.0f) {
#ifdef JAXLLM_AMX
    if constexpr (std::is_same_v<T, uint16_t>) {
      if (jaxllm::TilesGranted())
        return AttendItemLanes<T, kD, true>(item, sh, q, k_layer, v_layer, tables, context_lens, starts, opt, out);
    }
#endif
    AttendItemLanes<T, kD>(item, sh, q, k_layer, v_layer, tables, context_lens, starts, opt, out);
  } else if (item.count == 1)
    AttendRow<T, kD>(item, sh, q, k_layer, v_layer, tables, context_lens, starts, opt, out);
  else
    AttendItem<T, kD, 16, true>(item, sh, q, k_layer, v_layer, tables, context_lens, starts, opt, out);
}
#endif  // __AVX512F__

// The work items of a step, longest first; an error names the first input that breaks the contract.
ffi::Error MakeItems(const Shapes& sh, int64_t num_seqs, const int32_t* tables, const int32_t* context_lens,
                     const int32_t* starts, int64_t sliding_window, std::vector<Item>& items) {
  if (starts[0] < 0 || starts[num_seqs] > sh.num_tokens)
    return ffi::Error::InvalidArgument("query_start_loc runs outside the query tokens");
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = starts[s + 1] - starts[s], context = context_lens[s];
    if (q_len < 0) return ffi::Error::InvalidArgument("query_start_loc must be non-decreasing");
    if (q_len == 0) continue;
    if (context < q_len || context > sh.max_blocks * sh.block_size)
      return ffi::Error::InvalidArgument("context_lens[" + std::to_string(s) + "] = " + std::to_string(context) +
                                         " is below its query length or beyond its block table");
    for (int64_t b = 0; b * sh.block_size < context; ++b) {
      const int32_t block = tables[s * sh.max_blocks + b];
      if (block < 0 || block >= sh.num_blocks)
        return ffi::Error::InvalidArgument("block_tables[" + std::to_string(s) + ", " + std::to_string(b) +
                                           "] = " + std::to_string(block) + " is not a pool block");
    }
    for (int64_t first = 0; first < q_len; first += kQueryTile) {
      const int64_t count = std::min(kQueryTile, q_len - first);
      const int64_t first_pos = context - q_len + first;
      const int64_t keys = first_pos + count - FirstKey(first_pos, sliding_window) / sh.block_size * sh.block_size;
      for (int64_t h = 0; h < sh.num_kv_heads; ++h) items.push_back({s, h, first, count, keys * count});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  return ffi::Error::Success();
}

template <typename T>
ffi::Error Attend(ffi::ThreadPool& pool, const Shapes& sh, int64_t num_seqs, ffi::Buffer<ffi::F32> q,
                  ffi::AnyBuffer k_pool, ffi::AnyBuffer v_pool, int64_t layer, const int32_t* tables,
                  const int32_t* context_lens, const int32_t* starts, const Options& opt, const Output& out) {
  std::vector<Item> items;
  if (ffi::Error error = MakeItems(sh, num_seqs, tables, context_lens, starts, opt.sliding_window, items);
      error.failure())
    return error;
  const int64_t layer_elems = sh.num_blocks * sh.num_kv_heads * sh.block_size * sh.head_dim;
  const T* k_layer = static_cast<const T*>(k_pool.untyped_data()) + layer * layer_elems;
  const T* v_layer = static_cast<const T*>(v_pool.untyped_data()) + layer * layer_elems;
  const float* q_data = q.typed_data();
  std::memset(out.data, 0, (out.bf16 ? 2 : 4) * sh.num_tokens * sh.num_q_heads * sh.head_dim);  // +0.0 either way
  auto attend_all = [&](auto attend_item) {
    jaxllm::ParallelFor(pool, static_cast<int64_t>(items.size()), [&](int64_t i) {
      attend_item(items[i], sh, q_data, k_layer, v_layer, tables, context_lens, starts, opt, out);
    });
  };
#ifdef __AVX512F__
  if (sh.head_dim == 64 && sh.block_size == 16) {
    attend_all(AttendItemSimd<T, 64>);
  } else if (sh.head_dim == 128 && sh.block_size == 16) {
    attend_all(AttendItemSimd<T, 128>);
  } else if (sh.head_dim == 256 && sh.block_size == 16) {
    attend_all(AttendItemSimd<T, 256>);
  } else {
    attend_all(AttendItem<T, 0, 0>);
  }
#else
  if (sh.head_dim == 64 && sh.block_size == 16) {
    attend_all(AttendItem<T, 64, 16>);
  } else if (sh.head_dim == 128 && sh.block_size == 16) {
    attend_all(AttendItem<T, 128, 16>);
  } else if (sh.head_dim == 256 && sh.block_size == 16) {
    attend_all(AttendItem<T, 256, 16>);
  } else {
    attend_all(AttendItem<T, 0, 0>);
  }
#endif
  return ffi::Error::Success();
}

ffi::Error RaggedPagedAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k_pool,
                                ffi::AnyBuffer v_pool, ffi::Buffer<ffi::S32> layer,
                                ffi::Buffer<ffi::S32> block_tables, ffi::Buffer<ffi::S32> context_lens,
                                ffi::Buffer<ffi::S32> query_start_loc, float sm_scale, int64_t sliding_window,
                                float logit_softcap, ffi::Result<ffi::AnyBuffer> out) {
  if (sliding_window < 0) return ffi::Error::InvalidArgument("sliding_window must be >= 1 (0: none)");
  if (!(logit_softcap >= 0.0f) || std::isinf(logit_softcap))
    return ffi::Error::InvalidArgument("logit_softcap must be finite and > 0 (0: none)");
  const Options opt{sm_scale, sliding_window, logit_softcap};
  const auto qd = q.dimensions(), pd = k_pool.dimensions(), td = block_tables.dimensions();
  if (qd.size() != 3 || pd.size() != 5 || td.size() != 2 || v_pool.dimensions().size() != 5)
    return ffi::Error::InvalidArgument("q must be [T, Hq, D], the pools [L, N, Hkv, B, D], block_tables [S, MB]");
  const Shapes sh{qd[0], qd[1], qd[2], pd[1], pd[2], pd[3], td[1]};
  const int64_t num_seqs = td[0];
  if (pd[4] != sh.head_dim || sh.num_kv_heads == 0 || sh.num_q_heads % sh.num_kv_heads != 0)
    return ffi::Error::InvalidArgument("q heads must be a multiple of the pool's KV heads, with one head size");
  if (context_lens.element_count() != num_seqs || query_start_loc.element_count() != num_seqs + 1)
    return ffi::Error::InvalidArgument("context_lens must be [S] and query_start_loc [S+1]");
  if (k_pool.element_type() != v_pool.element_type())
    return ffi::Error::InvalidArgument("k_pool and v_pool must share a dtype");
  if (out->element_type() != ffi::F32 && out->element_type() != ffi::BF16)
    return ffi::Error::InvalidArgument("out must be float32 or bfloat16");
  const Output result{out->untyped_data(), out->element_type() == ffi::BF16};
  const int64_t layer_index = *layer.typed_data();
  if (layer_index < 0 || layer_index >= pd[0]) return ffi::Error::InvalidArgument("layer is not a pool layer");
  const int32_t *tables = block_tables.typed_data(), *ctx = context_lens.typed_data(),
                *starts = query_start_loc.typed_data();
  switch (k_pool.element_type()) {
    case ffi::F32:
      return Attend<float>(pool, sh, num_seqs, q, k_pool, v_pool, layer_index, tables, ctx, starts, opt, result);
    case ffi::BF16:
      return Attend<uint16_t>(pool, sh, num_seqs, q, k_pool, v_pool, layer_index, tables, ctx, starts, opt,
                              result);
    default:
      return ffi::Error::InvalidArgument("the KV pool must be float32 or bfloat16");
  }
}

}  // namespace

// 1 where prompt chunks over a bfloat16 pool attend on AMX tiles (the build has them and the operating system grants
// their state), else 0.
extern "C" int JaxllmAttentionOnAmx() {
#ifdef JAXLLM_AMX
  return jaxllm::TilesGranted() ? 1 : 0;
#else
  return 0;
#endif
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxllmRaggedPagedAttention, RaggedPagedAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::AnyBuffer>()         // k_pool
                                  .Arg<ffi::AnyBuffer>()         // v_pool
                                  .Arg<ffi::Buffer<ffi::S32>>()  // layer
                                  .Arg<ffi::Buffer<ffi::S32>>()  // block_tables
                                  .Arg<ffi::Buffer<ffi::S32>>()  // context_lens
                                  .Arg<ffi::Buffer<ffi::S32>>()  // query_start_loc
                                  .Attr<float>("sm_scale")
                                  .Attr<int64_t>("sliding_window")  // 0: none
                                  .Attr<float>("logit_softcap")     // 0: none
                                  .Ret<ffi::AnyBuffer>()         // out: float32 or bfloat16
);
