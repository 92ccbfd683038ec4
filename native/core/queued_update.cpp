#include "queued_update.h"

#include <cfloat>
#include <cmath>
#include <cstdint>

namespace sapipe::core {

float clipped_grad_scale(const GradClip& clip, double squared_norm, double* grad_norm) {
  *grad_norm = std::sqrt(squared_norm) * clip.base * clip.unscale;
  double factor = clip.unscale;
  if (std::isfinite(*grad_norm) && *grad_norm > clip.max_norm) factor *= clip.max_norm / (*grad_norm + 1e-6);
  return static_cast<float>(clip.base * factor);
}

sapipe_status run_queued_update(const QueuedUpdate& update, sapipe_update_result* result, double* grad_norm) {
  if (update.latch != nullptr) {
    if (sapipe_status s = wait_for_latch(update.latch, update.latch_slot, update.deadline); s != SAPIPE_OK) return s;
  }
  if (update.gate != nullptr && (update.gate[0] != 0.0f || update.gate[1] != 0.0f)) {
    *result = {0, static_cast<int64_t>(update.gate[0])};
    return SAPIPE_OK;
  }
  sapipe_update_config config = update.config;
  if (update.clip) {
    double sq = 0;
    const sapipe_update_buffers& b = update.buffers;
    if (b.grad == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
    if (sapipe_status s = sapipe_cpu_squared_norm(b.grad + b.offset, b.count, &sq); s != SAPIPE_OK) return s;
    config.grad_scale = clipped_grad_scale(*update.clip, sq, grad_norm);
  }
  return sapipe_cpu_update(&config, &update.buffers, result);
}

sapipe_status guard_verdict(const float* grad, size_t count, double ranks, float* gate) {
  gate[0] = 0.0f;
  gate[1] = 1.0f;
  double sq = 0;
  if (sapipe_status s = sapipe_cpu_squared_norm(grad, count, &sq); s != SAPIPE_OK) return s;
  const double norm = std::sqrt(sq);
  int64_t bad = 0;
  // A non-finite norm means a NaN/Inf element, or finite elements whose squares overflowed:
  // only the count tells which, and the latter is an overflow risk, not a skip.
  if (!std::isfinite(norm)) {
    if (sapipe_status s = sapipe_cpu_count_non_finite(grad, count, &bad); s != SAPIPE_OK) return s;
  }
  gate[0] = static_cast<float>(bad);
  gate[1] = bad == 0 && !(norm * ranks < static_cast<double>(FLT_MAX) / 2) ? 1.0f : 0.0f;
  return SAPIPE_OK;
}

}  // namespace sapipe::core
