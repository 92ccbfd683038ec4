// Timing of one fused update variant against a device-to-device copy on the current device:
// the measurement behind `sapipe bench kernels --device cuda:N` and native/bench.
#pragma once

#include <cstddef>

#include "sapipe/plugin.h"

namespace sapipe::cuda {

sapipe_status bench_update(const sapipe_update_config& config, size_t count, int reps, int warmup,
                           sapipe_cuda_bench_result* out);

}  // namespace sapipe::cuda
