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

// The CUDA plugin. Candidates: the files in SAPIPE_CUDA_PLUGIN when set (one path, or several
// separated by ':'), else sapipe_cuda.so (the newest toolkit, CUDA 13) and sapipe_cuda11.so
// (CUDA 11.8: Volta and drivers older than CUDA 13's) beside the addon. See choose_cuda_plugin.
// Loaded once per process; later calls return the first result.
const PluginLoad& cuda_plugin();
// The same search, not cached: for tests that point SAPIPE_CUDA_PLUGIN at different files.
PluginLoad load_cuda_plugin_uncached();

// Picks one of candidates (in order of preference): where only one exists, that one, loaded
// without touching a device (as a single plugin always was). Otherwise each that exists is loaded
// and asked for its devices, and the first that loads and has a visible device able to run its
// code is taken: a driver too old for a plugin's runtime, or a GPU it has no code for (a V100
// under CUDA 13), passes it over. When none can run here, the first that loaded is kept (its
// devices are still reported) and candidates_reason lists every candidate's reason. `choice`
// says why the file was taken; `source` names where the candidates came from.
PluginLoad choose_cuda_plugin(const std::vector<std::string>& candidates, const std::string& source, const char* missing_hint);

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

// Whether the plugin has nccl_fused_update_after (appended after the device entries): a plugin
// built before it serves everything else, and a step that waits on a backward pass's events is
// refused there.
bool has_fused_update_after(const sapipe_cuda_plugin_v1* cuda);

}  // namespace sapipe
