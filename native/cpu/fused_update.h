// The fused update: one pass over memory that scales, compensates, applies the optimizer and
// writes the predicted weights. The range is walked in blocks small enough that the block's
// temporaries stay in L1, and each stage is a simple loop the compiler vectorises; DRAM sees every
// buffer once (ALGORITHMS.md's byte count).
#pragma once

#include <algorithm>
#include <cstddef>

#include "compensate.h"
#include "inline.h"
#include "optim.h"
#include "predict.h"
#include "stream_store.h"
#include "../core/update_plan.h"

namespace sapipe::cpu {

using core::UpdatePlan;
using core::UpdatePointers;

constexpr size_t kUpdateBlock = 512;  // floats per temporary: 2 KiB, well inside L1

SAPIPE_KERNEL_BODY void fused_update_body(const UpdatePlan& p, const UpdatePointers& b, size_t count) {
  alignas(64) float gt[kUpdateBlock];  // the compensated gradient
  alignas(64) float ge[kUpdateBlock];  // the shadow step's gradient estimate, or plain SGD's applied direction
  alignas(64) float wh[kUpdateBlock];  // predicted weights on their way to a streaming store
  const bool shadow = p.prediction == SAPIPE_PREDICTION_SHADOW_STEP;
  const bool dc = p.compensation != SAPIPE_COMPENSATION_NONE;
  // Plain SGD's linear prediction needs the direction it just applied.
  const bool keep_direction = p.prediction == SAPIPE_PREDICTION_LINEAR && p.optimizer == SAPIPE_OPTIMIZER_SGD &&
                              p.momentum == 0.0f;
  for (size_t start = 0; start < count; start += kUpdateBlock) {
    const size_t len = std::min(kUpdateBlock, count - start);
    float* __restrict w = b.w + start;
    const float* __restrict g = b.g + start;
    // Out of place: the block of old weights is copied into the output first (it then sits in L1),
    // and the step runs on it in place; DRAM still sees one read and one write of w.
    if (b.w_in) std::copy(b.w_in + start, b.w_in + start + len, w);
    if (shadow)
      gradient_estimate(p, ge, g, p.grad_scale, b.local_grad ? b.local_grad + start : nullptr,
                        b.prev_local_grad ? b.prev_local_grad + start : nullptr, len);
    // Without compensation the optimizer reads the gradient straight from memory.
    const float* applied = g;
    float applied_scale = p.grad_scale;
    if (dc) {
      const float scale = p.grad_scale;
      float* __restrict backup = b.backup + start;
      for (size_t i = 0; i < len; ++i) gt[i] = g[i] * scale;
      compensate(gt, w, backup, len, p.compensation, p.lambda, p.compensation_eps);
      // Rotate: the next step's gradient will have been computed at these weights.
      for (size_t i = 0; i < len; ++i) backup[i] = w[i];
      applied = gt;
      applied_scale = 1.0f;
    }
    float* m = b.m ? b.m + start : nullptr;
    float* v = b.v ? b.v + start : nullptr;
    if (p.optimizer == SAPIPE_OPTIMIZER_SGD) sgd_stage(p, w, m, applied, applied_scale, keep_direction ? ge : nullptr, len);
    else adam_stage(p, w, m, v, applied, applied_scale, len);
    float* predicted = p.stream_predicted ? wh : b.predicted + start;
    if (shadow) {
      // After the rotation backup holds the pre-update weights: the estimate stands for those.
      if (p.compensate_estimate)
        compensate(ge, w, b.backup + start, len, p.compensation, p.lambda, p.compensation_eps);
      shadow_step(p, w, m, v, ge, predicted, len);
    } else if (p.prediction == SAPIPE_PREDICTION_LINEAR) {
      linear_prediction(p, w, m, v, ge, predicted, len);
    }
    if (p.stream_predicted) stream_store(b.predicted + start, wh, len);
  }
  if (p.stream_predicted) stream_fence();
}

}  // namespace sapipe::cpu
