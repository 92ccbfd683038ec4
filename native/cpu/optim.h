// The real optimizer step (ALGORITHMS.md section 1, PyTorch semantics) as a stage of the fused
// update on one L1-resident block. The gradient is g*scale: the raw gradient straight from memory
// with its scale, or the compensated block (scale 1). For plain SGD the stage can also write the
// applied direction d to d_out, which linear prediction reads.
#pragma once

#include <cmath>
#include <cstddef>

#include "inline.h"
#include "../core/update_plan.h"

namespace sapipe::cpu {

using core::UpdatePlan;
using core::UpdatePointers;

SAPIPE_KERNEL_BODY void sgd_stage(const UpdatePlan& p, float* __restrict w, float* __restrict m,
                                  const float* __restrict g, float scale, float* __restrict d_out,
                                  size_t len) {
  const float lr = p.lr, wd = p.weight_decay, mu = p.momentum;
  if (mu == 0.0f) {
    if (d_out != nullptr) {
      for (size_t i = 0; i < len; ++i) {
        float d = g[i] * scale + wd * w[i];
        d_out[i] = d;
        w[i] -= lr * d;
      }
    } else {
      for (size_t i = 0; i < len; ++i) w[i] -= lr * (g[i] * scale + wd * w[i]);
    }
    return;
  }
  const float keep = 1.0f - p.dampening;
  if (p.spike) {
    // Spike compensation: m = mu*m + d; w -= lr*(a*m + b*d). On the first step m = d.
    const float a = p.spike_a, b = p.spike_b;
    const float mu_eff = p.momentum_is_empty ? 0.0f : mu;
    for (size_t i = 0; i < len; ++i) {
      float d = g[i] * scale + wd * w[i];
      float mi = mu_eff * m[i] + d;
      m[i] = mi;
      w[i] -= lr * (a * mi + b * d);
    }
    return;
  }
  if (p.momentum_is_empty) {
    for (size_t i = 0; i < len; ++i) {
      float d = g[i] * scale + wd * w[i];
      m[i] = d;
      w[i] -= lr * (p.nesterov ? d + mu * d : d);
    }
    return;
  }
  if (p.nesterov) {
    for (size_t i = 0; i < len; ++i) {
      float d = g[i] * scale + wd * w[i];
      float mi = mu * m[i] + keep * d;
      m[i] = mi;
      w[i] -= lr * (d + mu * mi);
    }
  } else {
    for (size_t i = 0; i < len; ++i) {
      float d = g[i] * scale + wd * w[i];
      float mi = mu * m[i] + keep * d;
      m[i] = mi;
      w[i] -= lr * mi;
    }
  }
}

SAPIPE_KERNEL_BODY void adam_stage(const UpdatePlan& p, float* __restrict w, float* __restrict m,
                                   float* __restrict v, const float* __restrict g, float scale,
                                   size_t len) {
  const float b1 = p.beta1, b2 = p.beta2, c1 = 1.0f - p.beta1, c2 = 1.0f - p.beta2;
  const float step = p.step_size, isb2 = p.inv_sqrt_bc2, eps = p.eps;
  if (p.optimizer == SAPIPE_OPTIMIZER_ADAMW) {
    const float decay = p.decoupled_decay;
    for (size_t i = 0; i < len; ++i) {
      float d = g[i] * scale;
      float mi = b1 * m[i] + c1 * d;
      float vi = b2 * v[i] + c2 * d * d;
      m[i] = mi;
      v[i] = vi;
      w[i] = w[i] * decay - step * mi / (std::sqrt(vi) * isb2 + eps);
    }
  } else {
    const float wd = p.weight_decay;
    for (size_t i = 0; i < len; ++i) {
      float d = g[i] * scale + wd * w[i];
      float mi = b1 * m[i] + c1 * d;
      float vi = b2 * v[i] + c2 * d * d;
      m[i] = mi;
      v[i] = vi;
      w[i] -= step * mi / (std::sqrt(vi) * isb2 + eps);
    }
  }
}

}  // namespace sapipe::cpu
