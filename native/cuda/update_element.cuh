// The whole fused step of one element on the GPU: scale, gradient estimate, delay compensation,
// the optimizer step and the prediction, in registers (fused_update.cu runs it on four lanes per
// thread). Compiles for the host too (element.cuh), where native/tests/cuda_math_check.cpp checks
// it against the scalar reference for every kernel variant.
#pragma once

#include "compensate.cuh"
#include "element.cuh"
#include "optim.cuh"
#include "predict.cuh"

namespace sapipe::cuda {

using core::UpdatePlan;

// The whole step for one element; returns w_hat (meaningful when prediction is on).
SAPIPE_ELEMENT float update_element(const UpdatePlan& p, float& w, float g, float& m, float& v,
                                                float& backup, float local, float& prev_local) {
  const float a = g * p.grad_scale;
  float ge = 0.0f;
  if (p.prediction == SAPIPE_PREDICTION_SHADOW_STEP) ge = gradient_estimate(p, a, local, prev_local);
  float applied = a;
  const float w_old = w;
  if (p.compensation != SAPIPE_COMPENSATION_NONE) {
    applied = compensate(a, w, backup, p.compensation, p.lambda, p.compensation_eps);
    backup = w_old;  // the next step's gradient will have been computed at these weights
  }
  float d = 0.0f;
  if (p.optimizer == SAPIPE_OPTIMIZER_SGD) sgd_element(p, w, m, applied, d);
  else adam_element(p, w, m, v, applied);
  if (p.prediction == SAPIPE_PREDICTION_SHADOW_STEP) {
    // The estimate stands for the pre-update weights but meets the updated ones.
    if (p.compensate_estimate) ge = compensate(ge, w, w_old, p.compensation, p.lambda, p.compensation_eps);
    return shadow_step(p, w, m, v, ge);
  }
  if (p.prediction == SAPIPE_PREDICTION_LINEAR) return linear_prediction(p, w, m, v, d);
  return 0.0f;
}

}  // namespace sapipe::cuda
