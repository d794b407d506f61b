// The routed MoE experts on the CPU: an XLA FFI handler that reads each routed expert's weights in place.
//
// The contract is reference.py's (moe_experts_reference), which this is tested against:
//
//   x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I]: float32, or bfloat16 (one dtype for all three);
//   expert_ids [T, k] int32, expert_weights [T, k] float32  ->  out [T, H] float32 (the caller rounds to x's dtype)
//
//   out[t] = sum_j weight[t, j] * down_e(act(gate_e x[t]) * up_e x[t]),  e = expert_ids[t, j] in [0, E)
//
// Each expert's MLP rounds as the reference does in x's dtype: gate_up (float32 sums) rounded to it, act(gate) and
// act(gate) * up rounded to it, each expert's output rounded to it; the k outputs are summed in float32. A route
// whose id is outside [0, E) is dropped: nothing computed, its weight never read.
//
// Routes are sorted by expert (a counting sort), then two passes over work items, on the calling thread (XLA's
// intra-op pool was measured beside it and did not win on a 2-core machine):
//   gate_up  (expert, block of kCols intermediate columns): gate and up rows of that block against every row routed
//            to the expert, kRows rows at a time so each weight row loaded feeds kRows dot products;
//            hidden[p, cols] = act(gate) * up                                        [routes of e, kCols]
//   down     (expert, block of kCols output columns): out_route[p, cols] = hidden[p] @ w_down[e, cols].T
// then each token sums its kept routes' outputs with their weights. Weights are read where they lie: the expert's
// matrix is a pointer offset into the stack.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kRows = 4;   // routed rows that share each weight row load
constexpr int64_t kCols = 64;  // weight rows per work item

enum Activation : int64_t { kSilu = 0, kGeluTanh = 1 };

inline float ToFloat(float v) { return v; }
inline float ToFloat(uint16_t bf16) {  // bfloat16 bits -> float32: the high half of the float
  return __builtin_bit_cast(float, static_cast<uint32_t>(bf16) << 16);
}

// float32 -> the nearest bfloat16 (ties to even), returned as float32; NaN stays NaN.
inline float RoundBf16(float v) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, v);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return v;
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  return __builtin_bit_cast(float, rounded);
}

template <typename T>
inline float Round(float v) {  // to T's precision
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return RoundBf16(v);
  }
}

// The routes kept (id in [0, E)), sorted by expert, token order within an expert.
struct Routes {
  std::vector<int64_t> start;  // [E + 1]: expert e's routes are positions start[e] .. start[e + 1]
  std::vector<int64_t> route;  // [kept]: the route r = t * k + j at each position
  std::vector<int64_t> position;  // [T * k]: each route's position, -1 for a dropped route
};

Routes SortRoutes(const int32_t* ids, int64_t num_routes, int64_t num_experts) {
  Routes routes;
  routes.start.assign(num_experts + 1, 0);
  for (int64_t r = 0; r < num_routes; ++r)
    if (ids[r] >= 0 && ids[r] < num_experts) ++routes.start[ids[r] + 1];
  for (int64_t e = 0; e < num_experts; ++e) routes.start[e + 1] += routes.start[e];
  routes.route.resize(routes.start[num_experts]);
  routes.position.assign(num_routes, -1);
  std::vector<int64_t> next(routes.start.begin(), routes.start.end() - 1);
  for (int64_t r = 0; r < num_routes; ++r) {
    if (ids[r] < 0 || ids[r] >= num_experts) continue;
    routes.position[r] = next[ids[r]]++;
    routes.route[routes.position[r]] = r;
  }
  return routes;
}

// out[c * stride + i] = dot(w row c, rows[i]) for the n <= kRows rows, c in 0 .. num_cols: w [num_cols, K] of
// type W, rows n float32 vectors of K. The K loop vectorizes (built with -fassociative-math); each weight element
// loaded feeds n products.
template <int64_t kN, typename W>
void DotBlock(const W* w, int64_t num_cols, int64_t K, const float* const* rows, float* out, int64_t stride) {
  for (int64_t c = 0; c < num_cols; ++c) {
    const W* wc = w + c * K;
    float acc[kN] = {};
    for (int64_t i = 0; i < K; ++i) {
      const float wi = ToFloat(wc[i]);
      for (int64_t r = 0; r < kN; ++r) acc[r] += wi * rows[r][i];
    }
    for (int64_t r = 0; r < kN; ++r) out[r * stride + c] = acc[r];
  }
}

// DotBlock over any number of rows, kRows at a time.
template <typename W>
void DotRows(const W* w, int64_t num_cols, int64_t K, const float* const* rows, int64_t n, float* out,
             int64_t stride) {
  int64_t r = 0;
  for (; r + kRows <= n; r += kRows) DotBlock<kRows>(w, num_cols, K, rows + r, out + r * stride, stride);
  switch (n - r) {
    case 3: DotBlock<3>(w, num_cols, K, rows + r, out + r * stride, stride); break;
    case 2: DotBlock<2>(w, num_cols, K, rows + r, out + r * stride, stride); break;
    case 1: DotBlock<1>(w, num_cols, K, rows + r, out + r * stride, stride); break;
    default: break;
  }
}

inline float Act(float v, int64_t activation) {  // on an already rounded gate; the caller rounds the result
  if (activation == kSilu) return v / (1.0f + std::exp(-v));
  const float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);  // sqrt(2 / pi) (v + 0.044715 v^3)
  return 0.5f * v * (1.0f + std::tanh(inner));
}

struct Problem {
  int64_t T, H, I, E, k;
  const Routes* routes;
  std::vector<float> x;       // [T, H] x in float32
  std::vector<float> hidden;  // [kept, I]: act(gate) * up of each kept route, by position
  std::vector<float> out;     // [kept, H]: each kept route's expert output, rounded to x's dtype
};

// Pointers to the float32 x rows of the routes at positions p0 .. p0 + n (their tokens' rows).
void TokenRows(const Problem& pr, int64_t p0, int64_t n, std::vector<const float*>& rows) {
  rows.resize(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = pr.x.data() + (pr.routes->route[p0 + i] / pr.k) * pr.H;
}

// Work item (e, block b): gate and up columns b*kCols .. of expert e for its routes -> hidden.
template <typename W>
void GateUpItem(Problem& pr, const W* w_gate_up, int64_t e, int64_t b, int64_t activation) {
  const int64_t p0 = pr.routes->start[e], n = pr.routes->start[e + 1] - p0;
  const int64_t c0 = b * kCols, cols = std::min(kCols, pr.I - c0);
  thread_local std::vector<const float*> rows;
  thread_local std::vector<float> gate, up;  // [n, cols]
  TokenRows(pr, p0, n, rows);
  gate.resize(n * cols);
  up.resize(n * cols);
  const W* w = w_gate_up + e * 2 * pr.I * pr.H;  // expert e's [2I, H], in place
  DotRows(w + c0 * pr.H, cols, pr.H, rows.data(), n, gate.data(), cols);
  DotRows(w + (pr.I + c0) * pr.H, cols, pr.H, rows.data(), n, up.data(), cols);
  for (int64_t i = 0; i < n; ++i) {
    float* dst = pr.hidden.data() + (p0 + i) * pr.I + c0;
    for (int64_t c = 0; c < cols; ++c) {
      const float g = Round<W>(gate[i * cols + c]), u = Round<W>(up[i * cols + c]);
      dst[c] = Round<W>(Round<W>(Act(g, activation)) * u);
    }
  }
}

// Work item (e, block b): output columns b*kCols .. of expert e for its routes, rounded to x's dtype.
template <typename W>
void DownItem(Problem& pr, const W* w_down, int64_t e, int64_t b) {
  const int64_t p0 = pr.routes->start[e], n = pr.routes->start[e + 1] - p0;
  const int64_t c0 = b * kCols, cols = std::min(kCols, pr.H - c0);
  thread_local std::vector<const float*> rows;
  rows.resize(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = pr.hidden.data() + (p0 + i) * pr.I;
  float* out = pr.out.data() + p0 * pr.H + c0;
  DotRows(w_down + (e * pr.H + c0) * pr.I, cols, pr.I, rows.data(), n, out, pr.H);  // expert e's [H, I], in place
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < cols; ++c) out[i * pr.H + c] = Round<W>(out[i * pr.H + c]);
}

// The (expert, column block) items of the used experts, for a pass over `width` columns.
std::vector<std::pair<int64_t, int64_t>> Items(const Routes& routes, int64_t num_experts, int64_t width) {
  std::vector<std::pair<int64_t, int64_t>> items;
  for (int64_t e = 0; e < num_experts; ++e)
    if (routes.start[e + 1] > routes.start[e])
      for (int64_t b = 0; b * kCols < width; ++b) items.emplace_back(e, b);
  return items;
}

template <typename W>
void Experts(Problem& pr, const W* x, const W* w_gate_up, const W* w_down, const float* weights,
             int64_t activation, float* out) {
  pr.x.resize(pr.T * pr.H);
  for (int64_t i = 0; i < pr.T * pr.H; ++i) pr.x[i] = ToFloat(x[i]);
  const int64_t kept = pr.routes->route.size();
  pr.hidden.resize(kept * pr.I);
  pr.out.resize(kept * pr.H);
  for (const auto& [e, b] : Items(*pr.routes, pr.E, pr.I)) GateUpItem(pr, w_gate_up, e, b, activation);
  for (const auto& [e, b] : Items(*pr.routes, pr.E, pr.H)) DownItem(pr, w_down, e, b);
  std::memset(out, 0, sizeof(float) * pr.T * pr.H);
  for (int64_t r = 0; r < pr.T * pr.k; ++r) {
    const int64_t p = pr.routes->position[r];
    if (p < 0) continue;  // dropped: its weight is never read
    const float w = weights[r];
    float* dst = out + (r / pr.k) * pr.H;
    const float* src = pr.out.data() + p * pr.H;
    for (int64_t h = 0; h < pr.H; ++h) dst[h] += w * src[h];
  }
}

ffi::Error MoeExperts(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> expert_ids,
                      ffi::Buffer<ffi::F32> expert_weights, ffi::AnyBuffer w_gate_up, ffi::AnyBuffer w_down,
                      int64_t activation, ffi::ResultBuffer<ffi::F32> out) {
  const auto xd = x.dimensions(), id = expert_ids.dimensions(), gd = w_gate_up.dimensions(),
             dd = w_down.dimensions();
  if (xd.size() != 2 || id.size() != 2 || gd.size() != 3 || dd.size() != 3)
    return ffi::Error::InvalidArgument("x must be [T, H], expert_ids [T, k], w_gate_up [E, 2I, H], w_down [E, H, I]");
  const int64_t T = xd[0], H = xd[1], k = id[1], E = gd[0], I = gd[1] / 2;
  if (id[0] != T || expert_weights.element_count() != T * k || gd[1] != 2 * I || gd[2] != H || dd[0] != E ||
      dd[1] != H || dd[2] != I)
    return ffi::Error::InvalidArgument("moe shapes disagree: x [T, H], ids and weights [T, k], w_gate_up [E, 2I, H], "
                                       "w_down [E, H, I]");
  if (x.element_type() != w_gate_up.element_type() || x.element_type() != w_down.element_type())
    return ffi::Error::InvalidArgument("x, w_gate_up and w_down must share a dtype");
  if (activation != kSilu && activation != kGeluTanh)
    return ffi::Error::InvalidArgument("activation must be 0 (silu) or 1 (gelu_tanh)");
  const Routes routes = SortRoutes(expert_ids.typed_data(), T * k, E);
  Problem pr{T, H, I, E, k, &routes, {}, {}, {}};
  const float* weights = expert_weights.typed_data();
  switch (x.element_type()) {
    case ffi::F32:
      Experts(pr, x.typed_data<float>(), w_gate_up.typed_data<float>(), w_down.typed_data<float>(), weights,
              activation, out->typed_data());
      return ffi::Error::Success();
    case ffi::BF16:
      Experts(pr, static_cast<const uint16_t*>(x.untyped_data()), static_cast<const uint16_t*>(w_gate_up.untyped_data()),
              static_cast<const uint16_t*>(w_down.untyped_data()), weights, activation, out->typed_data());
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("x and the expert weights must be float32 or bfloat16");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxllmMoeExperts, MoeExperts,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()         // x [T, H]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // expert_ids [T, k]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // expert_weights [T, k]
                                  .Arg<ffi::AnyBuffer>()         // w_gate_up [E, 2I, H]
                                  .Arg<ffi::AnyBuffer>()         // w_down [E, H, I]
                                  .Attr<int64_t>("activation")   // 0: silu, 1: gelu_tanh
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [T, H]
);
