// Opening the CUDA plugin from a harness and moving host vectors to and from the device.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "../core/device/cuda_plugin.h"

namespace sapipe::tests {

// The plugin and device 0, or null with the reason printed.
inline const sapipe_cuda_plugin_v1* open_cuda(int device) {
  const PluginLoad& load = cuda_plugin();
  if (!load.table) {
    std::printf("CUDA plugin unavailable: %s\n", load.reason.c_str());
    return nullptr;
  }
  std::printf("CUDA plugin %s: %s\n", load.path.c_str(), load.choice.c_str());
  auto cuda = reinterpret_cast<const sapipe_cuda_plugin_v1*>(load.table);
  int32_t n = 0;
  if (cuda->device_count(&n) != SAPIPE_OK || cuda->set_device(device) != SAPIPE_OK) {
    std::printf("no usable CUDA device: %s\n", load.candidates_reason.empty() ? cuda->last_error() : load.candidates_reason.c_str());
    return nullptr;
  }
  sapipe_cuda_device_info info{};
  cuda->device_info(device, &info);
  std::printf("device %d: %s (sm_%d%d, %d SMs), plugin built for %s\n", device, info.name, info.major, info.minor,
              info.multiprocessors, cuda->build_architectures());
  return cuda;
}

// A device copy of a host vector, freed on destruction.
struct DeviceVector {
  const sapipe_cuda_plugin_v1* cuda;
  float* ptr = nullptr;
  size_t n;
  DeviceVector(const sapipe_cuda_plugin_v1* c, const std::vector<float>& host) : cuda(c), n(host.size()) {
    cuda->malloc_device(reinterpret_cast<void**>(&ptr), n * sizeof(float));
    cuda->copy_to_device(ptr, host.data(), n * sizeof(float), nullptr);
  }
  ~DeviceVector() { cuda->free_device(ptr); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  std::vector<float> host() const {
    std::vector<float> out(n);
    cuda->copy_to_host(out.data(), ptr, n * sizeof(float), nullptr);
    cuda->stream_synchronize(nullptr);
    return out;
  }
};

}  // namespace sapipe::tests
