// The device side of the plugin that is not a kernel: the driver check, device queries, memory,
// streams and events, each returning sapipe_status.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sapipe/plugin.h"

namespace sapipe::cuda {

// SAPIPE_OK when libcuda.so.1 can be opened and at least one device is visible; otherwise
// SAPIPE_ERR_BACKEND_UNAVAILABLE with what was missing in last_error().
sapipe_status device_count(int32_t* count);
sapipe_status device_info(int32_t device, sapipe_cuda_device_info* out);
// "sm_75 sm_80 ... compute_120": what this plugin was compiled for.
const char* build_architectures();

}  // namespace sapipe::cuda
