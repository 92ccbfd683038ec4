// Elastic averaging (AvgPipe, ALGORITHMS.md section 5) on device memory, as
// native/cpu/reduce.h's elastic_average_body: d = alpha*(x - c); x -= d; c += d.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "sapipe/status.h"

namespace sapipe::cuda {

sapipe_status enqueue_elastic_average(float* worker, float* center, size_t n, float alpha, cudaStream_t stream);

}  // namespace sapipe::cuda
