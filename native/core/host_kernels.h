// The host (CPU) kernels the communication backends reduce, copy and update with, as an
// interface: native/comm calls host_kernels(); native/cpu implements it (kernel_table.cpp) with the
// variant compiled for the active instruction set. So a backend depends on core, not on another
// backend. Each entry processes one contiguous range on the calling thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "update_plan.h"

namespace sapipe::core {

struct HostKernels {
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

// The kernels of the instruction set chosen at start (SAPIPE_SIMD or the best the CPU runs).
const HostKernels& host_kernels();

// The names ("baseline", "avx2", "avx512") of the instruction set host_kernels() runs and of the
// best one this CPU supports: what the addon's info() reports.
const char* host_kernels_simd();
const char* host_simd_supported();

}  // namespace sapipe::core
