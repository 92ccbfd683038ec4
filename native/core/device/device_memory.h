// Device memory through the CUDA plugin's table (sapipe/plugin.h), without Node: the allocation
// behind a CudaBuffer, shared with the queued operations that use it, and the short procedures
// the addon runs to completion on the legacy default stream. On failure *detail holds the
// plugin's reason, read on the calling thread (last_error is per thread).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sapipe/plugin.h"

namespace sapipe {

struct DeviceAllocation {
  const sapipe_cuda_plugin_v1* cuda = nullptr;
  float* data = nullptr;
  size_t length = 0;
  int32_t device = 0;
  // Queued operations using this memory (ERR_BUSY for copies and dispose while non-zero).
  std::atomic<int> users{0};
  DeviceAllocation() = default;
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  ~DeviceAllocation();

  // `length` zero-filled floats on `device`, which the caller has made current. Zero-filled like
  // host buffers (a ParamSet's padding must start at zero).
  static sapipe_status allocate(const sapipe_cuda_plugin_v1* cuda, int32_t device, size_t length, std::shared_ptr<DeviceAllocation>* out,
                                std::string* detail);
};

// Synchronous copies of count floats (host to device, device to host, device to device), enqueued
// on `stream` behind its earlier work and waited for there (a pipeline stage's own stream, which
// does not synchronise with the legacy default one).
sapipe_status copy_to_device_sync(const sapipe_cuda_plugin_v1* cuda, float* dst, const float* src, size_t count, std::string* detail,
                                  void* stream = nullptr);
sapipe_status copy_to_host_sync(const sapipe_cuda_plugin_v1* cuda, float* dst, const float* src, size_t count, std::string* detail,
                                void* stream = nullptr);
sapipe_status copy_on_device_sync(const sapipe_cuda_plugin_v1* cuda, float* dst, const float* src, size_t count, std::string* detail,
                                  void* stream = nullptr);

// The NaN/Inf elements of x[0, count), counted on the device (a device word allocated per call:
// not on a step's hot path).
sapipe_status count_non_finite_on_device(const sapipe_cuda_plugin_v1* cuda, const float* x, size_t count, int64_t* out,
                                         std::string* detail);

// out = (zero_first ? 0 : out) plus scale times the pairs of every rank's pack in `all` (rank r's
// at r * width: k int32 indices as float bits, then k values), ranks in order. *skipped counts
// the indices outside [0, out_length) (a corrupt pack), which add nothing.
sapipe_status scatter_add_packs_on_device(const sapipe_cuda_plugin_v1* cuda, float* out, size_t out_length, const float* all, size_t width,
                                          size_t k, size_t ranks, float scale, bool zero_first, int64_t* skipped, std::string* detail);

}  // namespace sapipe
