// The fused update on the GPU: the non-finite guard and the single-pass update of
// native/cpu/fused_update.h, enqueued on a stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../core/update_plan.h"
#include "sapipe/kernels.h"

namespace sapipe::cuda {

// Enqueues, on stream: guard_count = 0 and the count of non-finite elements of the gradients the
// step reads (unless the configuration says they are checked), then the update, which every
// block skips when guard_count is non-zero. The checks of config and buffers are the caller's.
// guard_count: device memory (one int64); may be null only when config.grad_checked is set.
sapipe_status enqueue_fused_update(const sapipe_update_config& config, const sapipe_update_buffers& buffers,
                                   uint16_t* predicted_bf16, int64_t* guard_count, cudaStream_t stream);

// The update alone, skipped by every block when *skip_flag is non-zero (skip_flag may be null):
// for callers that computed the guard themselves (the bucketed all-reduce).
sapipe_status enqueue_fused_update_guarded_by(const sapipe_update_config& config, const sapipe_update_buffers& buffers,
                                              uint16_t* predicted_bf16, const int64_t* skip_flag, cudaStream_t stream);

}  // namespace sapipe::cuda
