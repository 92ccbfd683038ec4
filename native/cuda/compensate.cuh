// Delay compensation (ALGORITHMS.md section 2) of one element, the same formula as
// native/cpu/compensate.h: g + lambda*g*g*(w_now - w_then) [/ sqrt(g*g + eps)].
#pragma once

#include "element.cuh"

#include "sapipe/kernels.h"

namespace sapipe::cuda {

SAPIPE_ELEMENT float compensate(float g, float w_now, float w_then, int kind, float lambda, float eps) {
  const float gg = g * g;
  if (kind == SAPIPE_COMPENSATION_ADAPTIVE) return g + lambda * gg * (w_now - w_then) / sqrtf(gg + eps);
  return g + lambda * gg * (w_now - w_then);
}

}  // namespace sapipe::cuda
