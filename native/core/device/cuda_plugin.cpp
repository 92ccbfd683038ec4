#include "cuda_plugin.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <mutex>

namespace sapipe {

namespace {

constexpr const char* kMissingHint =
    " (this build has no CUDA plugin: it is built by `npm run build:native` when a CUDA toolkit is found)";

// "CUDA 13.0" from the runtime's 13000.
std::string runtime_name(const sapipe_cuda_plugin_v1* cuda) {
  const int32_t v = cuda->runtime_version();
  return "CUDA " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string describe(const PluginLoad& load) {
  const auto* cuda = reinterpret_cast<const sapipe_cuda_plugin_v1*>(load.table);
  return load.path + " (" + runtime_name(cuda) + ", built for " + cuda->build_architectures() + ")";
}

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

}  // namespace

PluginLoad choose_cuda_plugin(const std::vector<std::string>& candidates, const std::string& source, const char* missing_hint) {
  std::vector<std::string> existing;
  for (const std::string& c : candidates)
    if (plugin_file_exists(c)) existing.push_back(c);
  // A plugin built before the entries appended to v1 still serves the base table; its users check
  // table_size before using the appended entries.
  const auto load = [](const std::string& path) {
    return load_plugin(path, "cuda", SAPIPE_CUDA_PLUGIN_ABI_VERSION, SAPIPE_CUDA_PLUGIN_V1_BASE_SIZE);
  };
  if (existing.empty()) {
    PluginLoad out = load(candidates.empty() ? std::string() : candidates.front());
    if (candidates.size() > 1) out.reason = "the cuda plugin was not found: looked for " + join(candidates, " and ");
    out.reason += missing_hint;
    return out;
  }
  if (existing.size() == 1) {
    PluginLoad out = load(existing.front());
    out.choice = candidates.size() == 1 ? source + " names it" : "the only CUDA plugin present (" + source + ")";
    return out;
  }
  std::vector<std::string> passed;  // "path: why not", in order
  PluginLoad first_loaded;
  for (const std::string& path : existing) {
    PluginLoad candidate = load(path);
    if (candidate.table == nullptr) {
      passed.push_back(candidate.reason);
      continue;
    }
    const CudaReport report = report_cuda_devices(reinterpret_cast<const sapipe_cuda_plugin_v1*>(candidate.table));
    if (report.available) {
      candidate.choice = describe(candidate) + ": a visible device can run its code";
      if (!passed.empty()) candidate.choice += "; passed over " + join(passed, "; ");
      return candidate;
    }
    passed.push_back(describe(candidate) + ": " + report.reason);
    if (first_loaded.table == nullptr) first_loaded = candidate;
  }
  PluginLoad out = first_loaded.table != nullptr ? first_loaded : load(existing.front());
  out.candidates_reason = "no CUDA plugin can run here (" + source + "): " + join(passed, "; ");
  if (out.table == nullptr)
    out.reason = out.candidates_reason;
  else
    out.choice = "none can run here; kept the first that loaded, " + out.path;
  return out;
}

PluginLoad load_cuda_plugin_uncached() {
  const char* override_paths = std::getenv("SAPIPE_CUDA_PLUGIN");
  std::vector<std::string> candidates;
  if (override_paths != nullptr && *override_paths != '\0') {
    std::string list = override_paths;
    for (size_t start = 0; start <= list.size();) {
      const size_t colon = std::min(list.find(':', start), list.size());
      if (colon > start) candidates.push_back(list.substr(start, colon - start));
      start = colon + 1;
    }
    return choose_cuda_plugin(candidates, "SAPIPE_CUDA_PLUGIN", "");
  }
  const std::string dir = module_directory();
  const std::string folder = dir.empty() ? std::string(".") : dir;
  return choose_cuda_plugin({folder + "/sapipe_cuda.so", folder + "/sapipe_cuda11.so"}, "beside the addon", kMissingHint);
}

const PluginLoad& cuda_plugin() {
  static std::once_flag once;
  static PluginLoad load;
  std::call_once(once, [] { load = load_cuda_plugin_uncached(); });
  return load;
}

const sapipe_cuda_plugin_v1* cuda_table(const PluginLoad& load, std::string* reason) {
  if (load.table == nullptr) {
    *reason = load.reason;
    return nullptr;
  }
  return reinterpret_cast<const sapipe_cuda_plugin_v1*>(load.table);
}

CudaReport report_cuda_devices(const sapipe_cuda_plugin_v1* cuda) {
  CudaReport out;
  int32_t count = 0;
  if (cuda->device_count(&count) != SAPIPE_OK) {
    out.reason = std::string("the CUDA plugin loaded, but ") + cuda->last_error();
    return out;
  }
  out.counted = true;
  for (int32_t d = 0; d < count; ++d) {
    CudaDeviceReport device;
    if (cuda->device_info(d, &device.info) == SAPIPE_OK) {
      device.listed = true;
      out.available = out.available || device.info.kernels_available != 0;
    } else {
      device.error = cuda->last_error();
    }
    out.devices.push_back(device);
  }
  if (!out.available)
    out.reason = std::string("no visible device can run this plugin's code (built for ") + cuda->build_architectures() + ")";
  return out;
}

CudaLibraryReport report_cuda_library(const sapipe_cuda_plugin_v1* cuda, const std::string& plugin_reason, CudaLibrary library) {
  using Probe = sapipe_status (*sapipe_cuda_plugin_v1::*)(int32_t*, const char**);
  const bool nccl = library == CudaLibrary::kNccl;
  const char* name = nccl ? "NCCL" : "cuBLAS";
  const Probe probe = nccl ? &sapipe_cuda_plugin_v1::nccl_probe : &sapipe_cuda_plugin_v1::cublas_probe;
  // The probe lies below this byte of the table: a plugin whose table is shorter predates it.
  const size_t probe_end =
      (nccl ? offsetof(sapipe_cuda_plugin_v1, nccl_probe) : offsetof(sapipe_cuda_plugin_v1, cublas_probe)) + sizeof(void*);
  CudaLibraryReport out;
  const bool has_probe = cuda != nullptr && cuda->header.table_size >= probe_end && cuda->*probe != nullptr;
  const char* path = nullptr;
  if (cuda == nullptr)
    out.reason = std::string(name) + " is used through the CUDA plugin, which is unavailable: " + plugin_reason;
  else if (!has_probe)
    out.reason = "the CUDA plugin predates its " + std::string(name) + " entries: rebuild it with `npm run build:native`";
  else if ((cuda->*probe)(&out.version, &path) != SAPIPE_OK)
    out.reason = cuda->last_error();
  else {
    out.available = true;
    out.path = path ? path : "";
  }
  return out;
}

namespace {
// The table up to the entries appended with device buffers, NCCL, MSTopK and the model operations:
// what the addon needs before it offers any of them. Later entries are checked where they are used.
constexpr size_t kDeviceEntriesSize = offsetof(sapipe_cuda_plugin_v1, nccl_fused_update_after);
}  // namespace

bool has_fused_update_after(const sapipe_cuda_plugin_v1* cuda) {
  return cuda->header.table_size >= offsetof(sapipe_cuda_plugin_v1, nccl_fused_update_after) + sizeof(void*) &&
         cuda->nccl_fused_update_after != nullptr;
}

bool has_device_entries(const sapipe_cuda_plugin_v1* cuda, const std::string& plugin_path, std::string* reason) {
  const bool complete = cuda->header.table_size >= kDeviceEntriesSize && cuda->stream_query && cuda->nccl_get_unique_id &&
                        cuda->nccl_comm_init_rank && cuda->nccl_comm_destroy && cuda->nccl_comm_abort && cuda->nccl_comm_async_error &&
                        cuda->nccl_all_reduce && cuda->nccl_reduce_scatter && cuda->nccl_all_gather && cuda->nccl_broadcast &&
                        cuda->nccl_send && cuda->nccl_recv && cuda->nccl_fused_update && cuda->nccl_fused_update_recheck &&
                        cuda->nccl_fused_update_result;
  if (!complete)
    *reason = "the CUDA plugin " + plugin_path + " predates device buffers and NCCL communicators (its table has " +
              std::to_string(cuda->header.table_size) + " bytes, " + std::to_string(kDeviceEntriesSize) +
              " are needed): rebuild it with `npm run build:native`";
  return complete;
}

}  // namespace sapipe
