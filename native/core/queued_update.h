// What a host optimizer step queued on an execution queue does when it runs, without Node: wait
// for its latch (latch.h), read the step's guard verdict, clip the gradient, then the fused update
// (sapipe_cpu_update); and the guard verdict itself. The addon's updateAsync and guardAsync
// (native/addon/update_binding.cpp) convert the arguments, hold the buffers and queue these.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>

#include "latch.h"
#include "sapipe/kernels.h"

namespace sapipe::core {

// Gradient-norm clipping decided where the update runs, once the gradient it reads is complete
// (behind its all-reduce on a queue): the norm in the units the optimizer applies is
// sqrt(sum g^2) * base * unscale, and above max_norm the step's scale becomes
// base * unscale * max_norm / (norm + 1e-6). Computed in double in the same order as the trainer's
// JavaScript path, so both give the same float scale.
struct GradClip {
  double max_norm = 0;
  double base = 1;     // the optimizer's gradScale
  double unscale = 1;  // loss scale and accumulation removed
};

// The grad_scale a clipped step applies, from the gradient's sum of squares; *grad_norm receives
// the norm in the optimizer's units. A non-finite norm means a non-finite gradient: the guard
// skips that step, so it is not clipped.
float clipped_grad_scale(const GradClip& clip, double squared_norm, double* grad_norm);

// One queued update. A gated update (one bucket of a step whose buckets update as their
// reductions land) runs only when the step's all-reduced guard verdict, gate[0] (non-finite inputs
// over every rank) and gate[1] (ranks whose inputs could overflow a sum), is all zeros; otherwise
// it writes nothing and reports gate[0] as its non-finite count. The verdict is complete when the
// update runs: its all-reduce was queued before the bucket's reduction on the same queue.
struct QueuedUpdate {
  sapipe_update_config config{};
  sapipe_update_buffers buffers{};
  std::optional<GradClip> clip;     // not with a gate: the norm needs every bucket
  const float* gate = nullptr;      // 2 floats; null: not gated
  const float* latch = nullptr;     // null: runs at once; else waits for latch[latch_slot]
  size_t latch_slot = 0;
  // Absolute, from submission: every collective queued before the signal has its own deadline
  // from its submission, so the signal comes within about one timeout unless it is dropped.
  LatchClock::time_point deadline{};
};

// Runs the update on the calling thread (the queue's): the latch's status when the wait fails,
// else the kernels'. *grad_norm is set when the update clips.
sapipe_status run_queued_update(const QueuedUpdate& update, sapipe_update_result* result, double* grad_norm);

// This rank's half of a bucketed step's guard, queued before its reductions: gate[0] = the
// gradient's non-finite elements, gate[1] = 1 when they are none but the elements are large
// enough that a sum of `ranks` of them could overflow fp32 (sqrt(sum g^2), which bounds every
// |g|, times ranks reaches FLT_MAX / 2), else 0. The caller then all-reduces the gate (a sum), so
// every rank reads the same verdict. One read of the gradient; until it completes the gate says
// skip (0, 1), so a failure is a verdict every rank reads alike.
sapipe_status guard_verdict(const float* grad, size_t count, double ranks, float* gate);

}  // namespace sapipe::core
