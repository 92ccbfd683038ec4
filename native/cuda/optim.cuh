// The real optimizer step of one element (ALGORITHMS.md section 1, PyTorch semantics), the same
// cases in the same order as native/cpu/optim.h. `a` is the applied gradient, already scaled
// and compensated; `d` receives the direction plain SGD applied (linear prediction reads it).
#pragma once

#include "element.cuh"

#include "../core/update_plan.h"

namespace sapipe::cuda {

using core::UpdatePlan;

SAPIPE_ELEMENT void sgd_element(const UpdatePlan& p, float& w, float& m, float a, float& d) {
  const float lr = p.lr, mu = p.momentum;
  d = a + p.weight_decay * w;
  if (mu == 0.0f) {
    w -= lr * d;
    return;
  }
  if (p.spike) {
    const float mi = (p.momentum_is_empty ? 0.0f : mu) * m + d;
    m = mi;
    w -= lr * (p.spike_a * mi + p.spike_b * d);
    return;
  }
  if (p.momentum_is_empty) {
    m = d;
    w -= lr * (p.nesterov ? d + mu * d : d);
    return;
  }
  const float mi = mu * m + (1.0f - p.dampening) * d;
  m = mi;
  w -= lr * (p.nesterov ? d + mu * mi : mi);
}

SAPIPE_ELEMENT void adam_element(const UpdatePlan& p, float& w, float& m, float& v, float a) {
  const bool decoupled = p.optimizer == SAPIPE_OPTIMIZER_ADAMW;
  const float d = decoupled ? a : a + p.weight_decay * w;
  const float mi = p.beta1 * m + (1.0f - p.beta1) * d;
  const float vi = p.beta2 * v + (1.0f - p.beta2) * d * d;
  m = mi;
  v = vi;
  const float step = p.step_size * mi / (sqrtf(vi) * p.inv_sqrt_bc2 + p.eps);
  w = decoupled ? w * p.decoupled_decay - step : w - step;
}

}  // namespace sapipe::cuda
