// Elementwise helpers that communication and clipping need, and the bandwidth references
// (triad, copy) benchmarks compare against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "inline.h"

namespace sapipe::cpu {

SAPIPE_KERNEL_BODY int64_t count_non_finite_body(const float* __restrict x, size_t n) {
  // 32-bit counts per run vectorise to full-width compares; runs are added in 64 bits.
  constexpr size_t kRun = 4096;
  int64_t bad = 0;
  for (size_t start = 0; start < n; start += kRun) {
    const size_t end = n - start < kRun ? n : start + kRun;
    uint32_t run = 0;
    for (size_t i = start; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + i, sizeof bits);
      run += (bits & 0x7f800000u) == 0x7f800000u;
    }
    bad += run;
  }
  return bad;
}

// out = scale * sum of inputs; counts non-finite results on the way (the guard for free).
SAPIPE_KERNEL_BODY int64_t sum_body(float* out, const float* const* inputs, size_t k, size_t n, float scale) {
  if (k == 1) {
    const float* a = inputs[0];
    for (size_t i = 0; i < n; ++i) out[i] = a[i] * scale;
  } else {
    // Two inputs at a time keeps each pass a vectorisable loop; out is written only once per pair.
    const float* a = inputs[0];
    const float* b = inputs[1];
    float* tmp = out;
    if (k == 2) {
      for (size_t i = 0; i < n; ++i) tmp[i] = (a[i] + b[i]) * scale;
    } else {
      for (size_t i = 0; i < n; ++i) tmp[i] = a[i] + b[i];
      for (size_t j = 2; j < k; ++j) {
        const float* c = inputs[j];
        const float s = j + 1 == k ? scale : 1.0f;
        for (size_t i = 0; i < n; ++i) tmp[i] = (tmp[i] + c[i]) * s;
      }
    }
  }
  return count_non_finite_body(out, n);
}

SAPIPE_KERNEL_BODY void scale_body(float* __restrict x, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}

SAPIPE_KERNEL_BODY void axpy_body(float* y, const float* x, size_t n, float a) {
  for (size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

SAPIPE_KERNEL_BODY double squared_norm_body(const float* __restrict x, size_t n) {
  // Sixteen independent float lanes vectorise without reassociating (no -ffast-math); they are
  // folded into a double every run so the sum of a large buffer keeps its accuracy.
  constexpr size_t kLanes = 16, kRun = 1024;
  double total = 0.0;
  size_t start = 0;
  for (; start + kRun <= n; start += kRun) {
    float acc[kLanes] = {};
    const float* __restrict p = x + start;
    for (size_t i = 0; i < kRun; i += kLanes)
      for (size_t j = 0; j < kLanes; ++j) acc[j] += p[i + j] * p[i + j];
    for (size_t j = 0; j < kLanes; ++j) total += acc[j];
  }
  for (; start < n; ++start) total += static_cast<double>(x[start]) * x[start];
  return total;
}

SAPIPE_KERNEL_BODY void elastic_average_body(float* __restrict x, float* __restrict c, size_t n, float alpha) {
  for (size_t i = 0; i < n; ++i) {
    float d = alpha * (x[i] - c[i]);
    x[i] -= d;
    c[i] += d;
  }
}

// STREAM's triad, in double precision as STREAM defines it: 24 B per element.
SAPIPE_KERNEL_BODY void triad_body(double* __restrict a, const double* __restrict b,
                                   const double* __restrict c, size_t n, double s) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

SAPIPE_KERNEL_BODY void copy_body(float* __restrict dst, const float* __restrict src, size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

}  // namespace sapipe::cpu
