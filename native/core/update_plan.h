// Everything a fused update needs per element, derived once per call from sapipe_update_config
// (bias corrections in double, spike-compensation coefficients, the shadow step's constants).
#pragma once

#include <cstddef>

#include "sapipe/kernels.h"
#include "sapipe/status.h"

namespace sapipe::core {

struct UpdatePlan {
  int optimizer;
  float lr, weight_decay;
  // SGD
  float momentum, dampening;
  bool nesterov, momentum_is_empty;
  bool spike;
  float spike_a, spike_b;
  // Adam: w -= step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps), at step t and (shadow) t + 1
  float beta1, beta2, eps;
  float step_size, inv_sqrt_bc2;
  float shadow_step_size, shadow_inv_sqrt_bc2;
  float decoupled_decay;  // AdamW: 1 - lr*wd
  float grad_scale, local_grad_scale;
  int compensation;
  float lambda, compensation_eps;
  int prediction, estimate;
  bool compensate_estimate, have_prev_local;
  float inv_world_size;
  float prediction_steps;
  float decay_pow_steps;  // AdamW linear prediction: (1 - lr*wd)^s
  bool stream_predicted;  // write w_hat with streaming stores (large outputs only)
};

// Each optimizer kind's state, in one table (native/core/update_plan.cpp): what a step keeps and
// how it decays is read here, never inferred from "not SGD". lib/optim/registry.ts is its
// TypeScript side.
struct OptimizerTraits {
  int kind;                  // sapipe_optimizer_kind
  const char* name;
  bool adaptive;             // Adam's moments and bias corrections (else SGD's momentum rule)
  bool always_momentum;      // keeps a first moment whatever its settings (SGD: only with momentum != 0)
  bool second_moment;        // keeps v
  bool decoupled_decay;      // AdamW: w *= 1 - lr*wd apart from the gradient
};
// The traits of `kind`, or null for a kind this build does not know.
const OptimizerTraits* optimizer_traits(int kind);
// The state buffers a step of this configuration reads and writes (check_update_config accepted it).
bool uses_momentum_buffer(const sapipe_update_config& config);
bool uses_second_moment(const sapipe_update_config& config);

// SAPIPE_OK or the status naming what is wrong; the buffers check covers missing buffers the
// configuration needs and overlaps between the ranges [offset, offset + count) of any two.
sapipe_status check_update_config(const sapipe_update_config& config);
sapipe_status check_update_buffers(const sapipe_update_config& config, const sapipe_update_buffers& buffers);
// True when the shadow step reads this worker's local gradient (the guard must scan it too).
bool update_reads_local_grad(const sapipe_update_config& config);
// Expects a configuration that check_update_config accepted.
UpdatePlan make_update_plan(const sapipe_update_config& config);

// p + i, or null for a buffer the step does not use.
inline const float* at(const float* p, size_t i) { return p ? p + i : nullptr; }
inline float* at(float* p, size_t i) { return p ? p + i : nullptr; }

// Pointers already advanced to the range being processed.
struct UpdatePointers {
  float* __restrict w;
  const float* __restrict g;
  float* __restrict m;
  float* __restrict v;
  float* __restrict backup;
  float* __restrict predicted;
  const float* __restrict local_grad;
  float* __restrict prev_local_grad;
  // Out of place: w is first filled from here (null: w is read in place).
  const float* __restrict w_in;
};

}  // namespace sapipe::core
