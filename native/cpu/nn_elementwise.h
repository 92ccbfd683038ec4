// The model operations' element loops that call exp (GELU, and the attention's softmax rows),
// compiled once per instruction set like the update kernels (kernel_table.h) so the exp runs
// vectorised: libm's expf is a call per element, which no compiler vectorises without
// -ffast-math. Each entry runs on the calling thread; the caller splits the work.
#pragma once

#include <cstddef>

#include "simd.h"

namespace sapipe::cpu {

struct NnElementKernels {
  // y[i] = x[i] sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) (sapipe/nn.h's GELU); y may be x.
  void (*gelu)(float* y, const float* x, size_t n);
  // GELU's backward (sapipe/nn.h); dx may be x or dy.
  void (*gelu_backward)(float* dx, const float* x, const float* dy, size_t n);
  // p[j] = exp(s[j] - shift) for j < n, and returns their sum (16 partial sums added in a fixed
  // order, the same at every level); p may be s.
  float (*exp_shifted)(float* p, const float* s, size_t n, float shift);
};

const NnElementKernels& nn_element_kernels(SimdLevel level);
inline const NnElementKernels& active_nn_element_kernels() { return nn_element_kernels(active_simd()); }

// The exp those loops use, for the checks: within 2 ulp of expf for x in [-87.3, 88], 0 below
// (float's normal range ends there), infinity above 88 (exp(88) is 1.65e38, near float's
// largest), NaN for NaN.
float nn_exp(float x);

}  // namespace sapipe::cpu
