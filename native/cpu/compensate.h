// Delay compensation (ALGORITHMS.md section 2) as a stage of the fused update, on one
// L1-resident block: gt holds the scaled gradient and becomes the compensated one.
#pragma once

#include <cmath>
#include <cstddef>

#include "inline.h"
#include "sapipe/kernels.h"

namespace sapipe::cpu {

// g_tilde = g + lambda*g*g*(w - w_c) [/ sqrt(g*g + eps)], then rotates backup: w_c <- current w.
SAPIPE_KERNEL_BODY void compensate_and_rotate(float* __restrict gt, const float* __restrict w,
                                              float* __restrict backup, size_t len, int kind,
                                              float lambda, float eps) {
  if (kind == SAPIPE_COMPENSATION_ADAPTIVE) {
    for (size_t i = 0; i < len; ++i) {
      float g = gt[i];
      float gg = g * g;
      gt[i] = g + lambda * gg * (w[i] - backup[i]) / std::sqrt(gg + eps);
      backup[i] = w[i];
    }
  } else {
    for (size_t i = 0; i < len; ++i) {
      float g = gt[i];
      gt[i] = g + lambda * g * g * (w[i] - backup[i]);
      backup[i] = w[i];
    }
  }
}

// Compensation of a gradient estimate that will meet w_new although it stands for w_old.
SAPIPE_KERNEL_BODY void compensate_estimate(float* __restrict ge, const float* __restrict w_new,
                                            const float* __restrict w_old, size_t len, int kind,
                                            float lambda, float eps) {
  if (kind == SAPIPE_COMPENSATION_ADAPTIVE) {
    for (size_t i = 0; i < len; ++i) {
      float g = ge[i];
      float gg = g * g;
      ge[i] = g + lambda * gg * (w_new[i] - w_old[i]) / std::sqrt(gg + eps);
    }
  } else {
    for (size_t i = 0; i < len; ++i) {
      float g = ge[i];
      ge[i] = g + lambda * g * g * (w_new[i] - w_old[i]);
    }
  }
}

}  // namespace sapipe::cpu
