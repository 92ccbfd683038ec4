// The C ABI of the CPU backend: argument checks, derived constants, the non-finite guard and
// the split of each kernel across the thread pool.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "../core/thread_pool.h"
#include "kernel_table.h"
#include "sapipe/kernels.h"

namespace sapipe::cpu {
namespace {

// Threads write disjoint ranges whose boundaries fall on cache lines (16 floats).
constexpr size_t kAlign = 16;

// From this many elements (16 MiB of predicted weights) the prediction output is written with
// streaming stores: it would not stay in cache for the next forward pass anyway, and a normal
// store would first read every line it writes.
constexpr size_t kStreamThreshold = size_t{1} << 22;

bool finite_at_least(float x, float lo) { return std::isfinite(x) && x >= lo; }
bool in_unit_open(float x) { return std::isfinite(x) && x >= 0.0f && x < 1.0f; }

sapipe_status check_config(const sapipe_update_config& c) {
  if (c.optimizer < SAPIPE_OPTIMIZER_SGD || c.optimizer > SAPIPE_OPTIMIZER_ADAMW) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (!finite_at_least(c.lr, 0.0f) || !finite_at_least(c.weight_decay, 0.0f)) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (!std::isfinite(c.grad_scale) || c.grad_scale <= 0.0f) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (c.step < 1) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (c.optimizer == SAPIPE_OPTIMIZER_SGD) {
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

bool uses_momentum_buffer(const sapipe_update_config& c) {
  return c.optimizer != SAPIPE_OPTIMIZER_SGD || c.momentum != 0.0f;
}
bool reads_local_grad(const sapipe_update_config& c) {
  return c.prediction == SAPIPE_PREDICTION_SHADOW_STEP && c.estimate != SAPIPE_ESTIMATE_PREV_SYNC;
}

sapipe_status check_buffers(const sapipe_update_config& c, const sapipe_update_buffers& b) {
  struct Use {
    const float* ptr;
    bool needed;
  };
  const std::array<Use, 8> uses = {{
      {b.weights, true},
      {b.grad, true},
      {b.momentum, uses_momentum_buffer(c)},
      {b.second_moment, c.optimizer != SAPIPE_OPTIMIZER_SGD},
      {b.backup, c.compensation != SAPIPE_COMPENSATION_NONE},
      {b.predicted, c.prediction != SAPIPE_PREDICTION_NONE},
      {b.local_grad, reads_local_grad(c)},
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

UpdatePlan make_plan(const sapipe_update_config& c) {
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
  if (c.optimizer != SAPIPE_OPTIMIZER_SGD) {
    auto corrections = [&](int64_t t, float& step_size, float& inv_sqrt_bc2) {
      double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(t));
      double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(t));
      step_size = static_cast<float>(c.lr / bc1);
      inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    };
    corrections(c.step, p.step_size, p.inv_sqrt_bc2);
    corrections(c.step + 1, p.shadow_step_size, p.shadow_inv_sqrt_bc2);
  }
  p.decoupled_decay = c.optimizer == SAPIPE_OPTIMIZER_ADAMW ? 1.0f - c.lr * c.weight_decay : 1.0f;
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

int64_t parallel_count_non_finite(const KernelTable& k, const float* x, size_t n) {
  ThreadPool& pool = ThreadPool::global();
  std::vector<int64_t> partial(static_cast<size_t>(pool.size()), 0);
  pool.parallel_for(n, kAlign, [&](int t, size_t lo, size_t hi) {
    partial[static_cast<size_t>(t)] = k.count_non_finite(x + lo, hi - lo);
  });
  int64_t total = 0;
  for (int64_t v : partial) total += v;
  return total;
}

const float* at(const float* p, size_t i) { return p ? p + i : nullptr; }
float* at(float* p, size_t i) { return p ? p + i : nullptr; }

}  // namespace

UpdatePlan make_update_plan(const sapipe_update_config& config) { return make_plan(config); }

}  // namespace sapipe::cpu

using namespace sapipe;
using namespace sapipe::cpu;

extern "C" {

int32_t sapipe_update_bytes_per_element(const sapipe_update_config* c) {
  if (c == nullptr) return 0;
  int32_t bytes = 12;  // read w, read g, write w
  if (c->optimizer != SAPIPE_OPTIMIZER_SGD) bytes = 28;
  else if (c->momentum != 0.0f) bytes = 20;
  if (c->compensation != SAPIPE_COMPENSATION_NONE) bytes += 8;  // backup read + write
  if (c->prediction != SAPIPE_PREDICTION_NONE) bytes += 4;      // w_hat write
  if (c->prediction == SAPIPE_PREDICTION_SHADOW_STEP) {
    if (c->estimate == SAPIPE_ESTIMATE_LOCAL) bytes += 4;
    if (c->estimate == SAPIPE_ESTIMATE_LOCAL_PREV_SYNC) bytes += 12;  // local, prev in, prev out
  }
  return bytes;
}

sapipe_status sapipe_cpu_update(const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                                sapipe_update_result* result) {
  if (config == nullptr || buffers == nullptr || result == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  result->applied = 0;
  result->non_finite_count = 0;
  if (sapipe_status s = check_config(*config); s != SAPIPE_OK) return s;
  if (sapipe_status s = check_buffers(*config, *buffers); s != SAPIPE_OK) return s;
  const sapipe_update_buffers& b = *buffers;
  const KernelTable& k = active_kernels();
  // The guard reads the gradients once before anything is written: a step is all or nothing.
  // A fused write-then-check would have to undo earlier blocks, which fp32 cannot do exactly.
  int64_t bad = 0;
  if (!config->grad_checked) {
    bad = parallel_count_non_finite(k, b.grad + b.offset, b.count);
    if (reads_local_grad(*config)) bad += parallel_count_non_finite(k, b.local_grad + b.offset, b.count);
  }
  if (bad != 0) {
    result->non_finite_count = bad;
    return SAPIPE_OK;
  }
  UpdatePlan plan = make_plan(*config);
  plan.stream_predicted = config->prediction != SAPIPE_PREDICTION_NONE && b.count >= kStreamThreshold;
  const size_t o = b.offset;
  ThreadPool::global().parallel_for(b.count, kAlign, [&](int, size_t lo, size_t hi) {
    const size_t s = o + lo;
    UpdatePointers ptrs{b.weights + s,      b.grad + s,         at(b.momentum, s),
                        at(b.second_moment, s), at(b.backup, s), at(b.predicted, s),
                        at(b.local_grad, s), at(b.prev_local_grad, s)};
    k.fused_update(plan, ptrs, hi - lo);
  });
  result->applied = 1;
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_elastic_average(float* worker, float* center, size_t count, float alpha) {
  if (worker == nullptr || center == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (!std::isfinite(alpha) || alpha < 0.0f || alpha > 1.0f) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (worker < center + count && center < worker + count) return SAPIPE_ERR_ALIASING;
  const KernelTable& k = active_kernels();
  ThreadPool::global().parallel_for(count, kAlign, [&](int, size_t lo, size_t hi) {
    k.elastic_average(worker + lo, center + lo, hi - lo, alpha);
  });
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_sum(float* out, const float* const* inputs, size_t num_inputs, size_t count,
                             float scale, int64_t* non_finite) {
  if (out == nullptr || inputs == nullptr || num_inputs == 0 || !std::isfinite(scale))
    return SAPIPE_ERR_INVALID_ARGUMENT;
  for (size_t i = 0; i < num_inputs; ++i) {
    if (inputs[i] == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
    // Inputs after the first are read after out has been written: only inputs[0] may be out.
    if (i > 0 && inputs[i] == out) return SAPIPE_ERR_ALIASING;
  }
  const KernelTable& k = active_kernels();
  ThreadPool& pool = ThreadPool::global();
  std::vector<int64_t> partial(static_cast<size_t>(pool.size()), 0);
  pool.parallel_for(count, kAlign, [&](int t, size_t lo, size_t hi) {
    std::vector<const float*> shifted(num_inputs);
    for (size_t i = 0; i < num_inputs; ++i) shifted[i] = inputs[i] + lo;
    partial[static_cast<size_t>(t)] = k.sum(out + lo, shifted.data(), num_inputs, hi - lo, scale);
  });
  if (non_finite != nullptr) {
    *non_finite = 0;
    for (int64_t v : partial) *non_finite += v;
  }
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_scale(float* x, size_t count, float scale) {
  if (x == nullptr || !std::isfinite(scale)) return SAPIPE_ERR_INVALID_ARGUMENT;
  const KernelTable& k = active_kernels();
  ThreadPool::global().parallel_for(count, kAlign, [&](int, size_t lo, size_t hi) { k.scale(x + lo, hi - lo, scale); });
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_axpy(float* y, const float* x, size_t count, float a) {
  if (y == nullptr || x == nullptr || !std::isfinite(a)) return SAPIPE_ERR_INVALID_ARGUMENT;
  const KernelTable& k = active_kernels();
  ThreadPool::global().parallel_for(count, kAlign, [&](int, size_t lo, size_t hi) { k.axpy(y + lo, x + lo, hi - lo, a); });
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_squared_norm(const float* x, size_t count, double* out) {
  if (x == nullptr || out == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  const KernelTable& k = active_kernels();
  ThreadPool& pool = ThreadPool::global();
  std::vector<double> partial(static_cast<size_t>(pool.size()), 0.0);
  pool.parallel_for(count, kAlign, [&](int t, size_t lo, size_t hi) {
    partial[static_cast<size_t>(t)] = k.squared_norm(x + lo, hi - lo);
  });
  *out = 0.0;
  for (double v : partial) *out += v;
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_count_non_finite(const float* x, size_t count, int64_t* out) {
  if (x == nullptr || out == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  *out = parallel_count_non_finite(active_kernels(), x, count);
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_triad(double* a, const double* b, const double* c, size_t count, double s) {
  if (a == nullptr || b == nullptr || c == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  const KernelTable& k = active_kernels();
  // 8 doubles per cache line.
  ThreadPool::global().parallel_for(count, 8, [&](int, size_t lo, size_t hi) { k.triad(a + lo, b + lo, c + lo, hi - lo, s); });
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_copy(float* dst, const float* src, size_t count) {
  if (dst == nullptr || src == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  const KernelTable& k = active_kernels();
  ThreadPool::global().parallel_for(count, kAlign, [&](int, size_t lo, size_t hi) { k.copy(dst + lo, src + lo, hi - lo); });
  return SAPIPE_OK;
}

}  // extern "C"
