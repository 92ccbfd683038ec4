// Weight prediction of one element (ALGORITHMS.md section 3), as native/cpu/predict.h: the SAPipe
// gradient estimate, the shadow optimizer step from the freshly updated state, and the linear
// prediction w - lr*s*D. Nothing here writes optimizer state.
#pragma once

#include "element.cuh"

#include "../core/update_plan.h"

namespace sapipe::cuda {

using core::UpdatePlan;

// g_est from the applied gradient a = A_{t-1} (scaled, not compensated) and the local gradient;
// local-prev-sync also rotates prev_local <- local.
SAPIPE_ELEMENT float gradient_estimate(const UpdatePlan& p, float a, float local, float& prev_local) {
  if (p.estimate == SAPIPE_ESTIMATE_LOCAL) return local * p.local_grad_scale;
  if (p.estimate == SAPIPE_ESTIMATE_PREV_SYNC) return a;
  float ge = a;
  // Without g_{t-1} (first shadow step) the estimate falls back to prev-sync.
  if (p.have_prev_local) ge = a + (local - prev_local) * (p.local_grad_scale * p.inv_world_size);
  prev_local = local;
  return ge;
}

SAPIPE_ELEMENT float shadow_step(const UpdatePlan& p, float w, float m, float v, float ge) {
  const float lr = p.lr, wd = p.weight_decay;
  if (p.optimizer == SAPIPE_OPTIMIZER_SGD) {
    const float mu = p.momentum;
    const float d = ge + wd * w;
    if (mu == 0.0f) return w - lr * d;
    if (p.spike) return w - lr * (p.spike_a * (mu * m + d) + p.spike_b * d);
    const float mi = mu * m + (1.0f - p.dampening) * d;
    return w - lr * (p.nesterov ? d + mu * mi : mi);
  }
  const bool decoupled = p.optimizer == SAPIPE_OPTIMIZER_ADAMW;
  const float d = decoupled ? ge : ge + wd * w;
  const float mi = p.beta1 * m + (1.0f - p.beta1) * d;
  const float vi = p.beta2 * v + (1.0f - p.beta2) * d * d;
  const float step = p.shadow_step_size * mi / (sqrtf(vi) * p.shadow_inv_sqrt_bc2 + p.eps);
  return decoupled ? w * p.decoupled_decay - step : w - step;
}

// d: the direction plain SGD just applied (its momentum-free "D").
SAPIPE_ELEMENT float linear_prediction(const UpdatePlan& p, float w, float m, float v, float d) {
  const float s = p.prediction_steps;
  if (p.optimizer == SAPIPE_OPTIMIZER_SGD) return w - p.lr * s * (p.momentum == 0.0f ? d : m);
  const float decay = p.optimizer == SAPIPE_OPTIMIZER_ADAMW ? p.decay_pow_steps : 1.0f;
  return w * decay - p.step_size * s * m / (sqrtf(v) * p.inv_sqrt_bc2 + p.eps);
}

}  // namespace sapipe::cuda
