// See nn_elementwise.h. The loops are written on GCC's vector types at each instruction set's own
// width (4 floats for the baseline's SSE, 8 for AVX2, 16 for AVX-512): the exp's out-of-range and
// NaN cases are lane selects, which the auto-vectoriser would not keep branch-free (it will not
// compute both sides of a select whose floating-point operations might trap), and a vector wider
// than the registers would be split lane by lane. The exp is Cephes' expf: x = n ln 2 + r with
// |r| <= ln 2 / 2, a degree-7 polynomial in r, then 2^n through the exponent bits.
//
// Elements go in chunks of kChunk (16) floats, as 16 / W vectors; a partial chunk at a loop's end
// runs in a padded copy, so every element gets the same arithmetic, and exp_shifted's 16 partial
// sums are the same at every level.
#include "nn_elementwise.h"

#include <cstdint>
#include <cstring>
#include <limits>

#include "inline.h"

namespace sapipe::cpu {
namespace {

constexpr size_t kChunk = 16;

template <size_t W>
struct Lanes {
  typedef float Floats __attribute__((vector_size(W * sizeof(float))));
  typedef int32_t Ints __attribute__((vector_size(W * sizeof(int32_t))));
  static constexpr size_t kPerChunk = kChunk / W;
};

constexpr float kExpLow = -87.33654f;  // ln(FLT_MIN): below it exp is not a normal float
constexpr float kExpHigh = 88.0f;      // keeps n <= 127, so 2^n is a normal float

// Vectors pass by reference: a vector passed or returned by value has another calling convention
// below its instruction set (GCC warns so), even where the call is inlined.
template <class F>
SAPIPE_KERNEL_BODY void exp_lanes(const F& x, F& out) {
  using I = decltype(x < x);
  const F lo = F{} + kExpLow, hi = F{} + kExpHigh;
  F xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const F fx = xc * 1.44269504088896341f + 0.5f;
  I n = __builtin_convertvector(fx, I);     // truncation
  n += __builtin_convertvector(n, F) > fx;  // minus one where that rounded up: floor(fx)
  const F nf = __builtin_convertvector(n, F);
  F r = xc - nf * 0.693359375f;  // ln 2 in two parts, the first exact in float
  r = r + nf * 2.12194440e-4f;
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const I bits = (n + 127) << 23;
  F y = p * (F)bits;  // a vector cast keeps the bits
  y = x < lo ? F{} : y;
  y = x > hi ? F{} + std::numeric_limits<float>::infinity() : y;
  out = x != x ? x : y;
}

// Runs body(vector index within the chunk, args, result) on every vector of kChunk-element chunks
// of the arrays: in place for the whole chunks, on copies padded with `pad` for the last partial one.
template <size_t W, size_t In, class Body>
SAPIPE_KERNEL_BODY void for_chunks(float* out, const float* const (&in)[In], size_t n, float pad, Body&& body) {
  using F = typename Lanes<W>::Floats;
  F args[In], result;
  size_t i = 0;
  for (; i + kChunk <= n; i += kChunk)
    for (size_t v = 0; v < Lanes<W>::kPerChunk; ++v) {
      for (size_t a = 0; a < In; ++a) std::memcpy(&args[a], in[a] + i + v * W, sizeof(F));
      body(v, args, result);
      std::memcpy(out + i + v * W, &result, sizeof result);
    }
  for (size_t v = 0; i < n; ++v, i += W) {
    float padded[W];
    for (size_t a = 0; a < In; ++a) {
      for (size_t l = 0; l < W; ++l) padded[l] = i + l < n ? in[a][i + l] : pad;
      std::memcpy(&args[a], padded, sizeof(F));
    }
    body(v, args, result);
    std::memcpy(padded, &result, sizeof(F));
    for (size_t l = 0; l < W && i + l < n; ++l) out[i + l] = padded[l];
  }
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

// sigmoid(2u) and 1 - sigmoid(2u) from t = exp(-2|u|), so neither loses precision (sapipe/nn.h).
template <class F>
SAPIPE_KERNEL_BODY void gelu_terms(const F& x, F& s, F& one_minus_s) {
  const F u = kGeluC * (x + kGeluA * x * x * x);
  F t;
  exp_lanes<F>(-2.0f * (u < 0.0f ? -u : u), t);
  const F r = 1.0f / (1.0f + t);
  const auto positive = u >= 0.0f;
  s = positive ? r : t * r;
  one_minus_s = positive ? t * r : r;
}

template <size_t W>
SAPIPE_KERNEL_BODY void gelu_body(float* y, const float* x, size_t n) {
  using F = typename Lanes<W>::Floats;
  const float* const in[1] = {x};
  for_chunks<W>(y, in, n, 0.0f, [](size_t, const F* a, F& out) __attribute__((always_inline)) {
    F s, one_minus_s;
    gelu_terms<F>(a[0], s, one_minus_s);
    out = a[0] * s;
  });
}

template <size_t W>
SAPIPE_KERNEL_BODY void gelu_backward_body(float* dx, const float* x, const float* dy, size_t n) {
  using F = typename Lanes<W>::Floats;
  const float* const in[2] = {x, dy};
  for_chunks<W>(dx, in, n, 0.0f, [](size_t, const F* a, F& out) __attribute__((always_inline)) {
    const F& v = a[0];
    F s, one_minus_s;
    gelu_terms<F>(v, s, one_minus_s);
    const F du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    out = a[1] * (s + 2.0f * v * s * one_minus_s * du);
  });
}

template <size_t W>
SAPIPE_KERNEL_BODY float exp_shifted_body(float* p, const float* s, size_t n, float shift) {
  using F = typename Lanes<W>::Floats;
  const float* const in[1] = {s};
  F sums[Lanes<W>::kPerChunk] = {};  // lane l of sums[v] adds elements v W + l, + 16, ...; padding adds exp(-inf) = 0
  for_chunks<W>(p, in, n, -std::numeric_limits<float>::infinity(), [&](size_t v, const F* a, F& out) __attribute__((always_inline)) {
    exp_lanes<F>(a[0] - shift, out);
    sums[v] += out;
  });
  float total = 0.0f;
  for (size_t v = 0; v < Lanes<W>::kPerChunk; ++v)
    for (size_t l = 0; l < W; ++l) total += sums[v][l];
  return total;
}

}  // namespace

#define SAPIPE_DEFINE_NN_VARIANT(ns, target, width)                                                                   \
  namespace ns {                                                                                                      \
  target void gelu(float* y, const float* x, size_t n) { gelu_body<width>(y, x, n); }                                \
  target void gelu_backward(float* dx, const float* x, const float* dy, size_t n) { gelu_backward_body<width>(dx, x, dy, n); } \
  target float exp_shifted(float* p, const float* s, size_t n, float shift) { return exp_shifted_body<width>(p, s, n, shift); } \
  const NnElementKernels table = {gelu, gelu_backward, exp_shifted};                                                  \
  }

SAPIPE_DEFINE_NN_VARIANT(nn_baseline, , 4)
SAPIPE_DEFINE_NN_VARIANT(nn_avx2, SAPIPE_TARGET_AVX2, 8)
SAPIPE_DEFINE_NN_VARIANT(nn_avx512, SAPIPE_TARGET_AVX512, 16)

const NnElementKernels& nn_element_kernels(SimdLevel level) {
  if (level > best_supported_simd()) level = best_supported_simd();
  switch (level) {
    case SimdLevel::kAvx512: return nn_avx512::table;
    case SimdLevel::kAvx2: return nn_avx2::table;
    case SimdLevel::kBaseline: return nn_baseline::table;
  }
  return nn_baseline::table;
}

float nn_exp(float x) {
  using F = Lanes<4>::Floats;
  F out;
  exp_lanes<F>(F{} + x, out);
  return out[0];
}

}  // namespace sapipe::cpu
