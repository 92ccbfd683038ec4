// Delay compensation (ALGORITHMS.md section 2) as a stage of the fused update, on one
// L1-resident block.
#pragma once

#include <cmath>
#include <cstddef>

#include "inline.h"
#include "sapipe/kernels.h"

namespace sapipe::cpu {

// g <- g + lambda*g*g*(w_now - w_then) [/ sqrt(g*g + eps)]: a gradient computed at w_then, applied
// at w_now.
SAPIPE_KERNEL_BODY void compensate(float* __restrict g, const float* __restrict w_now,
                                   const float* __restrict w_then, size_t len, int kind,
                                   float lambda, float eps) {
  if (kind == SAPIPE_COMPENSATION_ADAPTIVE) {
    for (size_t i = 0; i < len; ++i) {
      float gi = g[i];
      float gg = gi * gi;
      g[i] = gi + lambda * gg * (w_now[i] - w_then[i]) / std::sqrt(gg + eps);
    }
  } else {
    for (size_t i = 0; i < len; ++i) {
      float gi = g[i];
      g[i] = gi + lambda * gi * gi * (w_now[i] - w_then[i]);
    }
  }
}

}  // namespace sapipe::cpu
