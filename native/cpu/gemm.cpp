// SGEMM: argument checks, the split of C across the thread pool, and one blocked kernel per
// instruction set (gemm_blocked.inc). The micro-kernels use intrinsics rather than relying on
// auto-vectorisation: the library is compiled as ISO C++17, where GCC does not contract a*b+c
// into FMA, and FMA is half of the peak.
#include "gemm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "../core/thread_pool.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SAPIPE_GEMM_X86 1
#endif

#define SAPIPE_GEMM_INLINE inline __attribute__((always_inline))

namespace sapipe::cpu {
namespace {

using RegionFn = void (*)(const GemmArgs&, size_t, size_t, size_t, size_t);

#if SAPIPE_GEMM_X86

namespace gemm_baseline {
#define SAPIPE_GEMM_TARGET
// SSE2: 16 xmm registers hold the 6 x 2 accumulators, two B vectors and a broadcast.
struct Vec {
  using type = __m128;
  static constexpr size_t kLanes = 4;
  static constexpr size_t kRows = 6;
  static SAPIPE_GEMM_INLINE type zero() { return _mm_setzero_ps(); }
  static SAPIPE_GEMM_INLINE type load(const float* p) { return _mm_loadu_ps(p); }
  static SAPIPE_GEMM_INLINE void store(float* p, type v) { _mm_storeu_ps(p, v); }
  static SAPIPE_GEMM_INLINE type broadcast(float x) { return _mm_set1_ps(x); }
  static SAPIPE_GEMM_INLINE type mul(type a, type b) { return _mm_mul_ps(a, b); }
  static SAPIPE_GEMM_INLINE type fmadd(type a, type b, type c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
};
#include "gemm_blocked.inc"
#undef SAPIPE_GEMM_TARGET
}  // namespace gemm_baseline

namespace gemm_avx2 {
#define SAPIPE_GEMM_TARGET __attribute__((target("arch=x86-64-v3")))
// AVX2 + FMA: 6 x 2 ymm accumulators (12 of 16 registers).
struct Vec {
  using type = __m256;
  static constexpr size_t kLanes = 8;
  static constexpr size_t kRows = 6;
  SAPIPE_GEMM_TARGET static SAPIPE_GEMM_INLINE type zero() { return _mm256_setzero_ps(); }
  SAPIPE_GEMM_TARGET static SAPIPE_GEMM_INLINE type load(const float* p) { return _mm256_loadu_ps(p); }
  SAPIPE_GEMM_TARGET static SAPIPE_GEMM_INLINE void store(float* p, type v) { _mm256_storeu_ps(p, v); }
  SAPIPE_GEMM_TARGET static SAPIPE_GEMM_INLINE type broadcast(float x) { return _mm256_set1_ps(x); }
  SAPIPE_GEMM_TARGET static SAPIPE_GEMM_INLINE type mul(type a, type b) { return _mm256_mul_ps(a, b); }
  SAPIPE_GEMM_TARGET static SAPIPE_GEMM_INLINE type fmadd(type a, type b, type c) { return _mm256_fmadd_ps(a, b, c); }
};
#include "gemm_blocked.inc"
#undef SAPIPE_GEMM_TARGET
}  // namespace gemm_avx2

namespace gemm_avx512 {
#define SAPIPE_GEMM_TARGET __attribute__((target("arch=x86-64-v4,prefer-vector-width=512")))
// AVX-512: 12 x 2 zmm accumulators (24 of 32 registers): 24 FMAs per 2 loads and 12 broadcasts.
struct Vec {
  using type = __m512;
  static constexpr size_t kLanes = 16;
  static constexpr size_t kRows = 12;
  SAPIPE_GEMM_TARGET static SAPIPE_GEMM_INLINE type zero() { return _mm512_setzero_ps(); }
  SAPIPE_GEMM_TARGET static SAPIPE_GEMM_INLINE type load(const float* p) { return _mm512_loadu_ps(p); }
  SAPIPE_GEMM_TARGET static SAPIPE_GEMM_INLINE void store(float* p, type v) { _mm512_storeu_ps(p, v); }
  SAPIPE_GEMM_TARGET static SAPIPE_GEMM_INLINE type broadcast(float x) { return _mm512_set1_ps(x); }
  SAPIPE_GEMM_TARGET static SAPIPE_GEMM_INLINE type mul(type a, type b) { return _mm512_mul_ps(a, b); }
  SAPIPE_GEMM_TARGET static SAPIPE_GEMM_INLINE type fmadd(type a, type b, type c) { return _mm512_fmadd_ps(a, b, c); }
};
#include "gemm_blocked.inc"
#undef SAPIPE_GEMM_TARGET
}  // namespace gemm_avx512

RegionFn region_fn(SimdLevel level, size_t* rows_unit, size_t* cols_unit) {
  switch (level) {
    case SimdLevel::kAvx512:
      *rows_unit = gemm_avx512::kMR, *cols_unit = gemm_avx512::kNR;
      return gemm_avx512::gemm_region;
    case SimdLevel::kAvx2:
      *rows_unit = gemm_avx2::kMR, *cols_unit = gemm_avx2::kNR;
      return gemm_avx2::gemm_region;
    case SimdLevel::kBaseline: break;
  }
  *rows_unit = gemm_baseline::kMR, *cols_unit = gemm_baseline::kNR;
  return gemm_baseline::gemm_region;
}

#else  // not x86-64: one portable kernel on scalar "registers"

namespace gemm_portable {
#define SAPIPE_GEMM_TARGET
struct Vec {
  using type = float;
  static constexpr size_t kLanes = 1;
  static constexpr size_t kRows = 4;
  static SAPIPE_GEMM_INLINE type zero() { return 0.0f; }
  static SAPIPE_GEMM_INLINE type load(const float* p) { return *p; }
  static SAPIPE_GEMM_INLINE void store(float* p, type v) { *p = v; }
  static SAPIPE_GEMM_INLINE type broadcast(float x) { return x; }
  static SAPIPE_GEMM_INLINE type mul(type a, type b) { return a * b; }
  static SAPIPE_GEMM_INLINE type fmadd(type a, type b, type c) { return a * b + c; }
};
#include "gemm_blocked.inc"
#undef SAPIPE_GEMM_TARGET
}  // namespace gemm_portable

RegionFn region_fn(SimdLevel, size_t* rows_unit, size_t* cols_unit) {
  *rows_unit = gemm_portable::kMR, *cols_unit = gemm_portable::kNR;
  return gemm_portable::gemm_region;
}

#endif

// Below this many multiply-adds a product runs on the calling thread: waking the pool costs more.
constexpr double kParallelMacs = 1 << 18;

bool overlaps(const float* a, size_t a_len, const float* b, size_t b_len) {
  return a_len != 0 && b_len != 0 && a < b + b_len && b < a + a_len;
}

// Elements spanned by a rows x cols row-major matrix with leading dimension ld.
size_t extent(size_t rows, size_t cols, size_t ld) { return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols; }

}  // namespace

static sapipe_status sgemm_on(const GemmArgs& g, SimdLevel level, bool serial) {
  if (!std::isfinite(g.alpha) || !std::isfinite(g.beta)) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (g.m == 0 || g.n == 0) return SAPIPE_OK;
  if (g.c == nullptr || g.ldc < g.n) return SAPIPE_ERR_INVALID_ARGUMENT;
  const size_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const size_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  if (g.k > 0) {
    if (g.a == nullptr || g.b == nullptr || g.lda < a_cols || g.ldb < b_cols) return SAPIPE_ERR_INVALID_ARGUMENT;
    const size_t c_len = extent(g.m, g.n, g.ldc);
    if (overlaps(g.c, c_len, g.a, extent(a_rows, a_cols, g.lda)) || overlaps(g.c, c_len, g.b, extent(b_rows, b_cols, g.ldb)))
      return SAPIPE_ERR_ALIASING;
  }
  if (g.k == 0 || g.alpha == 0.0f) {
    // Nothing to accumulate: C = beta * C (beta == 0 clears without reading).
    for (size_t i = 0; i < g.m; ++i)
      for (size_t j = 0; j < g.n; ++j) g.c[i * g.ldc + j] = g.beta == 0.0f ? 0.0f : g.beta * g.c[i * g.ldc + j];
    return SAPIPE_OK;
  }
  if (level > best_supported_simd()) level = best_supported_simd();
  size_t rows_unit = 1, cols_unit = 1;
  const RegionFn region = region_fn(level, &rows_unit, &cols_unit);
  ThreadPool& pool = ThreadPool::current();
  const double macs = static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  if (serial || pool.size() == 1 || macs < kParallelMacs) {
    region(g, 0, g.m, 0, g.n);
    return SAPIPE_OK;
  }
  // Split the longer side of C in whole micro-tiles, so no thread computes a padded tile that
  // another one also covers. parallel_for splits [0, units * stride) into ranges that are
  // multiples of `stride`, one per thread; stride is at least its inline threshold so it never
  // runs the job inline.
  const bool by_rows = g.m >= g.n;
  const size_t unit = by_rows ? rows_unit : cols_unit;
  const size_t total = by_rows ? g.m : g.n;
  const size_t units = (total + unit - 1) / unit;
  const size_t stride = ThreadPool::kInlineThreshold;
  pool.parallel_for(units * stride, stride, [&](int, size_t lo, size_t hi) {
    const size_t begin = lo / stride * unit, end = std::min(total, hi / stride * unit);
    if (begin >= end) return;
    if (by_rows)
      region(g, begin, end, 0, g.n);
    else
      region(g, 0, g.m, begin, end);
  });
  return SAPIPE_OK;
}

sapipe_status sgemm_with(const GemmArgs& args, SimdLevel level) { return sgemm_on(args, level, false); }
sapipe_status sgemm(const GemmArgs& args) { return sgemm_on(args, active_simd(), false); }
sapipe_status sgemm_serial(const GemmArgs& args) { return sgemm_on(args, active_simd(), true); }

}  // namespace sapipe::cpu
