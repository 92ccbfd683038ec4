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

using core::at;
using core::check_update_buffers;
using core::check_update_config;
using core::make_update_plan;
using core::update_reads_local_grad;
using core::UpdatePlan;
using core::UpdatePointers;

namespace {

// Threads write disjoint ranges whose boundaries fall on cache lines (16 floats).
constexpr size_t kAlign = 16;

// From this many elements (16 MiB of predicted weights) the prediction output is written with
// streaming stores: it would not stay in cache for the next forward pass anyway, and a normal
// store would first read every line it writes.
constexpr size_t kStreamThreshold = size_t{1} << 22;

int64_t parallel_count_non_finite(const KernelTable& k, const float* x, size_t n) {
  ThreadPool& pool = ThreadPool::current();
  std::vector<int64_t> partial(static_cast<size_t>(pool.size()), 0);
  pool.parallel_for(n, kAlign, [&](int t, size_t lo, size_t hi) {
    partial[static_cast<size_t>(t)] = k.count_non_finite(x + lo, hi - lo);
  });
  int64_t total = 0;
  for (int64_t v : partial) total += v;
  return total;
}


}  // namespace

}  // namespace sapipe::cpu

using namespace sapipe;
using namespace sapipe::cpu;

extern "C" {

sapipe_status sapipe_cpu_update(const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                                sapipe_update_result* result) {
  if (config == nullptr || buffers == nullptr || result == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  result->applied = 0;
  result->non_finite_count = 0;
  if (sapipe_status s = check_update_config(*config); s != SAPIPE_OK) return s;
  if (sapipe_status s = check_update_buffers(*config, *buffers); s != SAPIPE_OK) return s;
  const sapipe_update_buffers& b = *buffers;
  const KernelTable& k = active_kernels();
  // The guard reads the gradients once before anything is written: a step is all or nothing.
  // A fused write-then-check would have to undo earlier blocks, which fp32 cannot do exactly.
  int64_t bad = 0;
  if (!config->grad_checked) {
    bad = parallel_count_non_finite(k, b.grad + b.offset, b.count);
    if (update_reads_local_grad(*config)) bad += parallel_count_non_finite(k, b.local_grad + b.offset, b.count);
  }
  if (bad != 0) {
    result->non_finite_count = bad;
    return SAPIPE_OK;
  }
  UpdatePlan plan = make_update_plan(*config);
  plan.stream_predicted = config->prediction != SAPIPE_PREDICTION_NONE && b.count >= kStreamThreshold;
  const size_t o = b.offset;
  ThreadPool::current().parallel_for(b.count, kAlign, [&](int, size_t lo, size_t hi) {
    const size_t s = o + lo;
    UpdatePointers ptrs{b.weights + s,      b.grad + s,         at(b.momentum, s),
                        at(b.second_moment, s), at(b.backup, s), at(b.predicted, s),
                        at(b.local_grad, s), at(b.prev_local_grad, s), at(b.weights_in, s)};
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
  ThreadPool::current().parallel_for(count, kAlign, [&](int, size_t lo, size_t hi) {
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
  ThreadPool& pool = ThreadPool::current();
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
  ThreadPool::current().parallel_for(count, kAlign, [&](int, size_t lo, size_t hi) { k.scale(x + lo, hi - lo, scale); });
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_axpy(float* y, const float* x, size_t count, float a) {
  if (y == nullptr || x == nullptr || !std::isfinite(a)) return SAPIPE_ERR_INVALID_ARGUMENT;
  const KernelTable& k = active_kernels();
  ThreadPool::current().parallel_for(count, kAlign, [&](int, size_t lo, size_t hi) { k.axpy(y + lo, x + lo, hi - lo, a); });
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_squared_norm(const float* x, size_t count, double* out) {
  if (x == nullptr || out == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  const KernelTable& k = active_kernels();
  ThreadPool& pool = ThreadPool::current();
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
  ThreadPool::current().parallel_for(count, 8, [&](int, size_t lo, size_t hi) { k.triad(a + lo, b + lo, c + lo, hi - lo, s); });
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_copy(float* dst, const float* src, size_t count) {
  if (dst == nullptr || src == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
  const KernelTable& k = active_kernels();
  ThreadPool::current().parallel_for(count, kAlign, [&](int, size_t lo, size_t hi) { k.copy(dst + lo, src + lo, hi - lo); });
  return SAPIPE_OK;
}

}  // extern "C"
