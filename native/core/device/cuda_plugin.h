// The CUDA plugin as the host sees it, without Node: where it is found and opened (with the ABI
// checks of ../plugin_loader.h), and what its table says about itself and this machine: its
// devices and whether any can run it, whether the libraries it opens at run time (NCCL, cuBLAS)
// are there, and whether it has the entries appended to v1 (device buffers, NCCL communicators).
// The addon's cudaStatus(), ncclStatus() and cublasStatus() report these, and its device bindings
// refuse a plugin without those entries (native/addon/device/cuda_binding.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../plugin_loader.h"
#include "sapipe/plugin.h"

namespace sapipe {

// The CUDA plugin: SAPIPE_CUDA_PLUGIN when set (a file), else sapipe_cuda.so beside the addon.
// Loaded once per process; later calls return the first result.
const PluginLoad& cuda_plugin();
// The same search, not cached: for tests that point SAPIPE_CUDA_PLUGIN at different files.
PluginLoad load_cuda_plugin_uncached();

// The table of a loaded CUDA plugin, or null with *reason saying why it did not load.
const sapipe_cuda_plugin_v1* cuda_table(const PluginLoad& load, std::string* reason);

struct CudaDeviceReport {
  bool listed = false;  // device_info answered; else `error` says why
  sapipe_cuda_device_info info{};
  std::string error;
};

struct CudaReport {
  bool available = false;   // some visible device can run the plugin's code
  std::string reason;       // why not, when unavailable
  bool counted = false;     // device_count answered: `devices` lists them
  std::vector<CudaDeviceReport> devices;
};

// The devices of a loaded plugin (cuda non-null), and whether any can run its code.
CudaReport report_cuda_devices(const sapipe_cuda_plugin_v1* cuda);

enum class CudaLibrary { kNccl, kCublas };

struct CudaLibraryReport {
  bool available = false;
  int32_t version = 0;
  std::string path;
  std::string reason;  // when unavailable
};

// A library the plugin opens at run time, through its probe entry. cuda may be null (the plugin
// did not load, for plugin_reason); a plugin whose table predates the probe says so.
CudaLibraryReport report_cuda_library(const sapipe_cuda_plugin_v1* cuda, const std::string& plugin_reason, CudaLibrary library);

// Whether the plugin has the entries appended to v1 (device buffers and NCCL); older plugins
// return a shorter table. When it lacks them, *reason says so and what to do (plugin_path: the
// file it was loaded from).
bool has_device_entries(const sapipe_cuda_plugin_v1* cuda, const std::string& plugin_path, std::string* reason);

}  // namespace sapipe
