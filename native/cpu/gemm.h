// Single-precision matrix multiply on the CPU backend: C = alpha * op(A) * op(B) + beta * C, all
// row-major with explicit leading dimensions. It serves the reference models of lib/nn (Linear
// forward Y = X W^T, backward dX = dY W and dW = dY^T X), so both operands may be transposed.
#pragma once

#include <cstddef>

#include "sapipe/status.h"
#include "simd.h"

namespace sapipe::cpu {

struct GemmArgs {
  bool trans_a = false;  // op(A) = A^T: A is stored k x m
  bool trans_b = false;  // op(B) = B^T: B is stored n x k
  size_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  size_t lda = 0;
  const float* b = nullptr;
  size_t ldb = 0;
  float beta = 0.0f;  // 0: C is written without being read (it may hold NaN)
  float* c = nullptr;
  size_t ldc = 0;
};

// Checks the arguments (null pointers, leading dimensions too small, non-finite alpha or beta,
// C overlapping A or B) and runs the kernel of the active instruction set over the calling thread's
// pool (ThreadPool::current()).
sapipe_status sgemm(const GemmArgs& args);
// The same with an explicit instruction set (tests and benchmarks); a level the CPU lacks is lowered.
sapipe_status sgemm_with(const GemmArgs& args, SimdLevel level);
// The same product on the calling thread only: for callers that are themselves a job of the
// thread pool (a pool runs one job at a time), such as a convolution split over its images.
sapipe_status sgemm_serial(const GemmArgs& args);

}  // namespace sapipe::cpu
