// Checks of an update's configuration and buffers, and the constants derived from it: shared by
// the CPU backend and the CUDA plugin, so both accept the same input and compute the same step.
#include <array>
#include <cmath>

#include "update_plan.h"

namespace sapipe::core {
namespace {

bool finite_at_least(float x, float lo) { return std::isfinite(x) && x >= lo; }
bool in_unit_open(float x) { return std::isfinite(x) && x >= 0.0f && x < 1.0f; }

constexpr std::array<OptimizerTraits, 3> kOptimizers = {{
    {SAPIPE_OPTIMIZER_SGD, "sgd", false, false, false, false},
    {SAPIPE_OPTIMIZER_ADAM, "adam", true, true, true, false},
    {SAPIPE_OPTIMIZER_ADAMW, "adamw", true, true, true, true},
}};

}  // namespace

const OptimizerTraits* optimizer_traits(int kind) {
  for (const OptimizerTraits& t : kOptimizers)
    if (t.kind == kind) return &t;
  return nullptr;
}

bool uses_momentum_buffer(const sapipe_update_config& c) {
  const OptimizerTraits* t = optimizer_traits(c.optimizer);
  return t != nullptr && (t->always_momentum || c.momentum != 0.0f);
}

bool uses_second_moment(const sapipe_update_config& c) {
  const OptimizerTraits* t = optimizer_traits(c.optimizer);
  return t != nullptr && t->second_moment;
}

sapipe_status check_update_config(const sapipe_update_config& c) {
  const OptimizerTraits* traits = optimizer_traits(c.optimizer);
  if (traits == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (!finite_at_least(c.lr, 0.0f) || !finite_at_least(c.weight_decay, 0.0f)) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (!std::isfinite(c.grad_scale) || c.grad_scale <= 0.0f) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (c.step < 1) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (!traits->adaptive) {
    if (!in_unit_open(c.momentum) || !std::isfinite(c.dampening) || c.dampening < 0.0f || c.dampening > 1.0f)
      return SAPIPE_ERR_INVALID_ARGUMENT;
    if (c.nesterov && (c.momentum == 0.0f || c.dampening != 0.0f)) return SAPIPE_ERR_INVALID_ARGUMENT;
    if (c.spike_delay >= 0 && (c.momentum == 0.0f || c.dampening != 0.0f || c.nesterov))
      return SAPIPE_ERR_INVALID_ARGUMENT;
  } else {
    if (!in_unit_open(c.beta1) || !in_unit_open(c.beta2)) return SAPIPE_ERR_INVALID_ARGUMENT;
    if (!std::isfinite(c.eps) || c.eps <= 0.0f) return SAPIPE_ERR_INVALID_ARGUMENT;
    if (c.spike_delay >= 0) return SAPIPE_ERR_INVALID_ARGUMENT;
  }
  if (c.compensation < SAPIPE_COMPENSATION_NONE || c.compensation > SAPIPE_COMPENSATION_ADAPTIVE)
    return SAPIPE_ERR_INVALID_ARGUMENT;
  if (c.compensation != SAPIPE_COMPENSATION_NONE &&
      (!finite_at_least(c.compensation_lambda, 0.0f) || !std::isfinite(c.compensation_eps) || c.compensation_eps <= 0.0f))
    return SAPIPE_ERR_INVALID_ARGUMENT;
  if (c.prediction < SAPIPE_PREDICTION_NONE || c.prediction > SAPIPE_PREDICTION_LINEAR) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (c.prediction == SAPIPE_PREDICTION_SHADOW_STEP) {
    if (c.estimate < SAPIPE_ESTIMATE_LOCAL || c.estimate > SAPIPE_ESTIMATE_LOCAL_PREV_SYNC) return SAPIPE_ERR_INVALID_ARGUMENT;
    if (c.compensate_estimate && c.compensation == SAPIPE_COMPENSATION_NONE) return SAPIPE_ERR_INVALID_ARGUMENT;
    if (!finite_at_least(c.world_size, 1.0f)) return SAPIPE_ERR_INVALID_ARGUMENT;
    if (!std::isfinite(c.local_grad_scale) || c.local_grad_scale <= 0.0f) return SAPIPE_ERR_INVALID_ARGUMENT;
  }
  if (c.prediction == SAPIPE_PREDICTION_LINEAR && !finite_at_least(c.prediction_steps, 0.0f))
    return SAPIPE_ERR_INVALID_ARGUMENT;
  return SAPIPE_OK;
}

bool update_reads_local_grad(const sapipe_update_config& c) {
  return c.prediction == SAPIPE_PREDICTION_SHADOW_STEP && c.estimate != SAPIPE_ESTIMATE_PREV_SYNC;
}

sapipe_status check_update_buffers(const sapipe_update_config& c, const sapipe_update_buffers& b) {
  struct Use {
    const float* ptr;
    bool needed;
  };
  const std::array<Use, 9> uses = {{
      {b.weights, true},
      {b.weights_in, b.weights_in != nullptr},
      {b.grad, true},
      {b.momentum, uses_momentum_buffer(c)},
      {b.second_moment, uses_second_moment(c)},
      {b.backup, c.compensation != SAPIPE_COMPENSATION_NONE},
      {b.predicted, c.prediction != SAPIPE_PREDICTION_NONE},
      {b.local_grad, update_reads_local_grad(c)},
      {b.prev_local_grad, c.prediction == SAPIPE_PREDICTION_SHADOW_STEP && c.estimate == SAPIPE_ESTIMATE_LOCAL_PREV_SYNC},
  }};
  for (const Use& u : uses)
    if (u.needed && u.ptr == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  // Every buffer the step touches must be distinct memory: the kernel reads and writes them in
  // one pass, so an overlap would read values it has already overwritten.
  for (size_t i = 0; i < uses.size(); ++i) {
    if (!uses[i].needed) continue;
    const float* a0 = uses[i].ptr + b.offset;
    for (size_t j = i + 1; j < uses.size(); ++j) {
      if (!uses[j].needed) continue;
      const float* b0 = uses[j].ptr + b.offset;
      if (a0 < b0 + b.count && b0 < a0 + b.count) return SAPIPE_ERR_ALIASING;
    }
  }
  return SAPIPE_OK;
}

UpdatePlan make_update_plan(const sapipe_update_config& c) {
  UpdatePlan p{};
  p.optimizer = c.optimizer;
  p.lr = c.lr;
  p.weight_decay = c.weight_decay;
  p.momentum = c.momentum;
  p.dampening = c.dampening;
  p.nesterov = c.nesterov != 0;
  p.momentum_is_empty = c.momentum_is_empty != 0;
  p.spike = c.spike_delay >= 0;
  if (p.spike) {
    double mu_d = std::pow(static_cast<double>(c.momentum), c.spike_delay);
    p.spike_a = static_cast<float>(mu_d);
    p.spike_b = static_cast<float>((1.0 - mu_d) / (1.0 - c.momentum));
  }
  p.beta1 = c.beta1;
  p.beta2 = c.beta2;
  p.eps = c.eps;
  const OptimizerTraits* traits = optimizer_traits(c.optimizer);
  if (traits->adaptive) {
    auto corrections = [&](int64_t t, float& step_size, float& inv_sqrt_bc2) {
      double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(t));
      double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(t));
      step_size = static_cast<float>(c.lr / bc1);
      inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    };
    corrections(c.step, p.step_size, p.inv_sqrt_bc2);
    corrections(c.step + 1, p.shadow_step_size, p.shadow_inv_sqrt_bc2);
  }
  p.decoupled_decay = traits->decoupled_decay ? 1.0f - c.lr * c.weight_decay : 1.0f;
  p.grad_scale = c.grad_scale;
  p.local_grad_scale = c.local_grad_scale;
  p.compensation = c.compensation;
  p.lambda = c.compensation_lambda;
  p.compensation_eps = c.compensation_eps;
  p.prediction = c.prediction;
  p.estimate = c.estimate;
  p.compensate_estimate = c.compensate_estimate != 0;
  p.have_prev_local = c.have_prev_local != 0;
  p.inv_world_size = c.world_size >= 1.0f ? 1.0f / c.world_size : 1.0f;
  p.prediction_steps = c.prediction_steps;
  p.decay_pow_steps = static_cast<float>(
      std::pow(1.0 - static_cast<double>(c.lr) * c.weight_decay, static_cast<double>(c.prediction_steps)));
  return p;
}

}  // namespace sapipe::core

// Bytes per element as ALGORITHMS.md counts them: with the plan, so every backend reports the same.
extern "C" int32_t sapipe_update_bytes_per_element(const sapipe_update_config* c) {
  if (c == nullptr) return 0;
  if (sapipe::core::optimizer_traits(c->optimizer) == nullptr) return 0;
  int32_t bytes = 12;                                           // read w, read g, write w
  if (sapipe::core::uses_momentum_buffer(*c)) bytes += 8;       // m read + write
  if (sapipe::core::uses_second_moment(*c)) bytes += 8;         // v read + write
  if (c->compensation != SAPIPE_COMPENSATION_NONE) bytes += 8;  // backup read + write
  if (c->prediction != SAPIPE_PREDICTION_NONE) bytes += 4;      // w_hat write
  if (c->prediction == SAPIPE_PREDICTION_SHADOW_STEP) {
    if (c->estimate == SAPIPE_ESTIMATE_LOCAL) bytes += 4;
    if (c->estimate == SAPIPE_ESTIMATE_LOCAL_PREV_SYNC) bytes += 12;  // local, prev in, prev out
  }
  return bytes;
}
