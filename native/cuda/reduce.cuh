// The elementwise helpers of native/cpu/reduce.h on device memory, enqueued on a stream. Results
// that are numbers go to device memory (the caller zeroes nothing: each function clears its own
// output first, so a count or norm is never added to a stale value). Checks are the caller's.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "sapipe/status.h"

namespace sapipe::cuda {

// Adds the count of NaN/Inf elements of x to *count (which it does not clear: the guard sums
// several buffers into one word).
void enqueue_count_non_finite(const float* x, size_t n, int64_t* count, cudaStream_t stream);

sapipe_status enqueue_count_non_finite_into(const float* x, size_t n, int64_t* device_out, cudaStream_t stream);
// out = scale * sum_i inputs[i]; counts non-finite results into *device_non_finite when not null.
sapipe_status enqueue_sum(float* out, const float* const* inputs, size_t k, size_t n, float scale,
                          int64_t* device_non_finite, cudaStream_t stream);
sapipe_status enqueue_scale(float* x, size_t n, float s, cudaStream_t stream);
sapipe_status enqueue_axpy(float* y, const float* x, size_t n, float a, cudaStream_t stream);
// Sum of squares accumulated in double.
sapipe_status enqueue_squared_norm(const float* x, size_t n, double* device_out, cudaStream_t stream);

}  // namespace sapipe::cuda
