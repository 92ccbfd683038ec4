// MSTopK (docs/ALGORITHMS.md section 6) on device memory, and the scatter-add of gathered
// (index, value) pairs: the CUDA counterparts of sapipe_cpu_topk_select and
// sapipe_cpu_scatter_add. The threshold search is the CPU kernel's (native/core/topk_search.h);
// only the passes over x run on the device.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "sapipe/kernels.h"
#include "sapipe/status.h"

namespace sapipe::cuda {

// Selects exactly k elements of x = grad (+ residual, formed in place in the residual) into
// out_indices/out_values (device memory, k entries, indices ascending) and zeroes them in the
// residual. grad must be finite. Waits for `stream` once per sampling pass (the search decides on
// the host from the pass's counts) and returns once the selection is written. stats: host memory
// or null.
sapipe_status topk_select(const float* grad, float* residual, size_t count, size_t k, int32_t rounds, int32_t* out_indices,
                          float* out_values, sapipe_topk_stats* stats, cudaStream_t stream);

// out[indices[i]] += scale * values[i] for i < n, enqueued. The indices of one call must be
// distinct (a selection's are): no element is added to twice, so no atomics and the same result
// on every rank. Indices outside [0, count) are skipped and counted into *device_bad when given.
sapipe_status enqueue_scatter_add(float* out, size_t count, const int32_t* indices, const float* values, size_t n, float scale,
                                  int64_t* device_bad, cudaStream_t stream);

}  // namespace sapipe::cuda
