// One function pointer per kernel, filled with the variant compiled for the active instruction
// set (simd.h). Each entry processes one contiguous range on the calling thread; cpu_api.cpp splits
// work across the thread pool.
#pragma once

#include <cstddef>
#include <cstdint>

#include "simd.h"
#include "update_plan.h"

namespace sapipe::cpu {

struct KernelTable {
  void (*fused_update)(const UpdatePlan&, const UpdatePointers&, size_t count);
  int64_t (*count_non_finite)(const float* x, size_t n);
  int64_t (*sum)(float* out, const float* const* inputs, size_t k, size_t n, float scale);
  void (*scale)(float* x, size_t n, float s);
  void (*axpy)(float* y, const float* x, size_t n, float a);
  double (*squared_norm)(const float* x, size_t n);
  void (*elastic_average)(float* x, float* c, size_t n, float alpha);
  void (*triad)(double* a, const double* b, const double* c, size_t n, double s);
  void (*copy)(float* dst, const float* src, size_t n);
};

const KernelTable& kernel_table(SimdLevel level);
inline const KernelTable& active_kernels() { return kernel_table(active_simd()); }

}  // namespace sapipe::cpu
