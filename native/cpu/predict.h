// Weight prediction (ALGORITHMS.md section 3) as stages of the fused update. Prediction reads the
// freshly updated state of the block (still in L1) and writes only the predicted weights.
#pragma once

#include <cmath>
#include <cstddef>

#include "inline.h"
#include "../core/update_plan.h"

namespace sapipe::cpu {

using core::UpdatePlan;
using core::UpdatePointers;

// The SAPipe gradient estimate, taken before the applied gradient is compensated.
// ga*scale is the applied gradient A_{t-1}; local-prev-sync also rotates prev_local <- local.
SAPIPE_KERNEL_BODY void gradient_estimate(const UpdatePlan& p, float* __restrict ge,
                                          const float* __restrict ga, float scale,
                                          const float* __restrict local,
                                          float* __restrict prev_local, size_t len) {
  const float ls = p.local_grad_scale;
  if (p.estimate == SAPIPE_ESTIMATE_LOCAL) {
    for (size_t i = 0; i < len; ++i) ge[i] = local[i] * ls;
  } else if (p.estimate == SAPIPE_ESTIMATE_PREV_SYNC) {
    for (size_t i = 0; i < len; ++i) ge[i] = ga[i] * scale;
  } else if (p.have_prev_local) {
    const float k = ls * p.inv_world_size;
    for (size_t i = 0; i < len; ++i) {
      float l = local[i];
      ge[i] = ga[i] * scale + (l - prev_local[i]) * k;
      prev_local[i] = l;
    }
  } else {
    // No g_{t-1} yet: the estimate falls back to prev-sync and stores g_t for the next step.
    for (size_t i = 0; i < len; ++i) {
      ge[i] = ga[i] * scale;
      prev_local[i] = local[i];
    }
  }
}

// A shadow optimizer step from the updated state with gradient estimate ge; writes w_hat only.
SAPIPE_KERNEL_BODY void shadow_step(const UpdatePlan& p, const float* __restrict w,
                                    const float* __restrict m, const float* __restrict v,
                                    const float* __restrict ge, float* __restrict w_hat,
                                    size_t len) {
  const float lr = p.lr, wd = p.weight_decay;
  if (p.optimizer == SAPIPE_OPTIMIZER_SGD) {
    const float mu = p.momentum;
    if (mu == 0.0f) {
      for (size_t i = 0; i < len; ++i) w_hat[i] = w[i] - lr * (ge[i] + wd * w[i]);
    } else if (p.spike) {
      const float a = p.spike_a, b = p.spike_b;
      for (size_t i = 0; i < len; ++i) {
        float d = ge[i] + wd * w[i];
        w_hat[i] = w[i] - lr * (a * (mu * m[i] + d) + b * d);
      }
    } else if (p.nesterov) {
      const float keep = 1.0f - p.dampening;
      for (size_t i = 0; i < len; ++i) {
        float d = ge[i] + wd * w[i];
        w_hat[i] = w[i] - lr * (d + mu * (mu * m[i] + keep * d));
      }
    } else {
      const float keep = 1.0f - p.dampening;
      for (size_t i = 0; i < len; ++i) {
        float d = ge[i] + wd * w[i];
        w_hat[i] = w[i] - lr * (mu * m[i] + keep * d);
      }
    }
    return;
  }
  const float b1 = p.beta1, b2 = p.beta2, c1 = 1.0f - p.beta1, c2 = 1.0f - p.beta2;
  const float step = p.shadow_step_size, isb2 = p.shadow_inv_sqrt_bc2, eps = p.eps;
  if (p.optimizer == SAPIPE_OPTIMIZER_ADAMW) {
    const float decay = p.decoupled_decay;
    for (size_t i = 0; i < len; ++i) {
      float d = ge[i];
      float mi = b1 * m[i] + c1 * d;
      float vi = b2 * v[i] + c2 * d * d;
      w_hat[i] = w[i] * decay - step * mi / (std::sqrt(vi) * isb2 + eps);
    }
  } else {
    for (size_t i = 0; i < len; ++i) {
      float d = ge[i] + wd * w[i];
      float mi = b1 * m[i] + c1 * d;
      float vi = b2 * v[i] + c2 * d * d;
      w_hat[i] = w[i] - step * mi / (std::sqrt(vi) * isb2 + eps);
    }
  }
}

// w_hat = w - lr*s*D (PipeOptim, SpecTrain, linear weight prediction). For plain SGD, d holds the
// direction just applied (left there by sgd_stage).
SAPIPE_KERNEL_BODY void linear_prediction(const UpdatePlan& p, const float* __restrict w,
                                          const float* __restrict m, const float* __restrict v,
                                          const float* __restrict d, float* __restrict w_hat,
                                          size_t len) {
  const float s = p.prediction_steps;
  if (p.optimizer == SAPIPE_OPTIMIZER_SGD) {
    const float k = p.lr * s;
    const float* __restrict dir = p.momentum == 0.0f ? d : m;
    for (size_t i = 0; i < len; ++i) w_hat[i] = w[i] - k * dir[i];
    return;
  }
  const float k = p.step_size * s, isb2 = p.inv_sqrt_bc2, eps = p.eps;
  const float decay = p.optimizer == SAPIPE_OPTIMIZER_ADAMW ? p.decay_pow_steps : 1.0f;
  for (size_t i = 0; i < len; ++i)
    w_hat[i] = w[i] * decay - k * m[i] / (std::sqrt(v[i]) * isb2 + eps);
}

}  // namespace sapipe::cpu
