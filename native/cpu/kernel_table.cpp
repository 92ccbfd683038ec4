// Instantiates every kernel body once per instruction set. The bodies are always_inline, so each
// wrapper below is compiled (and auto-vectorised) with its own target attribute; the portable
// baseline build of the library stays runnable on any x86-64 CPU.
#include "kernel_table.h"

#include "fused_update.h"
#include "reduce.h"

#define SAPIPE_DEFINE_VARIANT(ns, target)                                                        \
  namespace ns {                                                                                 \
  target void fused_update(const UpdatePlan& p, const UpdatePointers& b, size_t n) {             \
    fused_update_body(p, b, n);                                                                  \
  }                                                                                              \
  target int64_t count_non_finite(const float* x, size_t n) { return count_non_finite_body(x, n); } \
  target int64_t sum(float* out, const float* const* in, size_t k, size_t n, float s) {          \
    return sum_body(out, in, k, n, s);                                                           \
  }                                                                                              \
  target void scale(float* x, size_t n, float s) { scale_body(x, n, s); }                        \
  target void axpy(float* y, const float* x, size_t n, float a) { axpy_body(y, x, n, a); }       \
  target double squared_norm(const float* x, size_t n) { return squared_norm_body(x, n); }       \
  target void elastic_average(float* x, float* c, size_t n, float a) {                           \
    elastic_average_body(x, c, n, a);                                                            \
  }                                                                                              \
  target void triad(double* a, const double* b, const double* c, size_t n, double s) {           \
    triad_body(a, b, c, n, s);                                                                   \
  }                                                                                              \
  target void copy(float* d, const float* s, size_t n) { copy_body(d, s, n); }                   \
  const KernelTable table = {fused_update, count_non_finite, sum, scale, axpy,                   \
                             squared_norm, elastic_average, triad, copy};                        \
  }

namespace sapipe::cpu {

using core::UpdatePlan;
using core::UpdatePointers;

SAPIPE_DEFINE_VARIANT(baseline, )
SAPIPE_DEFINE_VARIANT(avx2, SAPIPE_TARGET_AVX2)
SAPIPE_DEFINE_VARIANT(avx512, SAPIPE_TARGET_AVX512)

const KernelTable& kernel_table(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512: return avx512::table;
    case SimdLevel::kAvx2: return avx2::table;
    case SimdLevel::kBaseline: return baseline::table;
  }
  return baseline::table;
}

}  // namespace sapipe::cpu

namespace sapipe::core {
const HostKernels& host_kernels() { return cpu::active_kernels(); }
const char* host_kernels_simd() { return cpu::simd_name(cpu::active_simd()); }
const char* host_simd_supported() { return cpu::simd_name(cpu::best_supported_simd()); }
}  // namespace sapipe::core
