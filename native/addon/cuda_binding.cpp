// The CUDA plugin seen from JS: whether it loads and why not, its devices, NCCL, and the kernel
// benchmark. The plugin is opened on the first call (never at require time), so the addon loads
// on machines without CUDA; every failure becomes a status object or an ERR_BACKEND_UNAVAILABLE.
#include <string>

#include "../core/plugin_loader.h"
#include "cuda_binding.h"

#include <cstddef>
#include "errors.h"
#include "js_args.h"
#include "sapipe/plugin.h"
#include "update_binding.h"

namespace sapipe::addon {
namespace {

const sapipe_cuda_plugin_v1* plugin_or_null(std::string* reason) {
  const PluginLoad& load = cuda_plugin();
  if (load.table == nullptr) {
    *reason = load.reason;
    return nullptr;
  }
  return reinterpret_cast<const sapipe_cuda_plugin_v1*>(load.table);
}

// {available, reason?, pluginPath, architectures?, runtimeVersion?, devices?}; never throws.
Napi::Value CudaStatus(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  std::string reason;
  const sapipe_cuda_plugin_v1* cuda = plugin_or_null(&reason);
  out.Set("pluginPath", cuda_plugin().path);
  if (cuda == nullptr) {
    out.Set("available", false);
    out.Set("reason", reason);
    return out;
  }
  out.Set("architectures", cuda->build_architectures());
  out.Set("runtimeVersion", cuda->runtime_version());
  int32_t count = 0;
  if (cuda->device_count(&count) != SAPIPE_OK) {
    out.Set("available", false);
    out.Set("reason", std::string("the CUDA plugin loaded, but ") + cuda->last_error());
    return out;
  }
  Napi::Array devices = Napi::Array::New(env);
  bool any_runnable = false;
  for (int32_t d = 0; d < count; ++d) {
    sapipe_cuda_device_info di{};
    Napi::Object o = Napi::Object::New(env);
    if (cuda->device_info(d, &di) == SAPIPE_OK) {
      o.Set("name", di.name);
      o.Set("computeCapability", std::to_string(di.major) + "." + std::to_string(di.minor));
      o.Set("multiprocessors", di.multiprocessors);
      o.Set("totalMemory", static_cast<double>(di.total_memory));
      o.Set("kernelsAvailable", di.kernels_available != 0);
      any_runnable = any_runnable || di.kernels_available != 0;
    } else {
      o.Set("error", cuda->last_error());
    }
    devices.Set(static_cast<uint32_t>(d), o);
  }
  out.Set("devices", devices);
  out.Set("available", any_runnable);
  if (!any_runnable)
    out.Set("reason", std::string("no visible device can run this plugin's code (built for ") + cuda->build_architectures() + ")");
  return out;
}

using LibraryProbe = sapipe_status (*sapipe_cuda_plugin_v1::*)(int32_t*, const char**);

// {available, reason?, version?, path?} of a library the CUDA plugin opens at run time (NCCL,
// cuBLAS) through its entry `probe`, which lies below byte `probe_end` of the table (a plugin
// whose table is shorter predates it); never throws.
Napi::Value LibraryStatus(Napi::Env env, const char* library, LibraryProbe probe, size_t probe_end) {
  Napi::Object out = Napi::Object::New(env);
  std::string reason;
  const sapipe_cuda_plugin_v1* cuda = plugin_or_null(&reason);
  const bool has_probe = cuda != nullptr && cuda->header.table_size >= probe_end && cuda->*probe != nullptr;
  int32_t version = 0;
  const char* path = nullptr;
  if (cuda == nullptr)
    reason = std::string(library) + " is used through the CUDA plugin, which is unavailable: " + reason;
  else if (!has_probe)
    reason = "the CUDA plugin predates its " + std::string(library) + " entries: rebuild it with `npm run build:native`";
  else if ((cuda->*probe)(&version, &path) != SAPIPE_OK)
    reason = cuda->last_error();
  else {
    out.Set("available", true);
    out.Set("version", version);
    out.Set("path", path ? path : "");
    return out;
  }
  out.Set("available", false);
  out.Set("reason", reason);
  return out;
}

Napi::Value NcclStatus(const Napi::CallbackInfo& info) {
  return LibraryStatus(info.Env(), "NCCL", &sapipe_cuda_plugin_v1::nccl_probe, offsetof(sapipe_cuda_plugin_v1, nccl_probe) + sizeof(void*));
}

// cuBLAS, which the plugin's model operations open for their products.
Napi::Value CublasStatus(const Napi::CallbackInfo& info) {
  return LibraryStatus(info.Env(), "cuBLAS", &sapipe_cuda_plugin_v1::cublas_probe,
                       offsetof(sapipe_cuda_plugin_v1, cublas_probe) + sizeof(void*));
}

// Whether the plugin has the entries appended to v1 (older plugins return a shorter table).
bool has_appended_entries(const sapipe_cuda_plugin_v1* cuda) {
  if (cuda->header.table_size < sizeof(sapipe_cuda_plugin_v1)) return false;
  return cuda->stream_query && cuda->nccl_get_unique_id && cuda->nccl_comm_init_rank && cuda->nccl_comm_destroy &&
         cuda->nccl_comm_abort && cuda->nccl_comm_async_error && cuda->nccl_all_reduce && cuda->nccl_reduce_scatter &&
         cuda->nccl_all_gather && cuda->nccl_broadcast && cuda->nccl_send && cuda->nccl_recv && cuda->nccl_fused_update &&
         cuda->nccl_fused_update_recheck && cuda->nccl_fused_update_result;
}

const sapipe_cuda_plugin_v1* require_appended(Napi::Env env) {
  std::string reason;
  const sapipe_cuda_plugin_v1* cuda = plugin_or_null(&reason);
  if (cuda == nullptr) throw_error(env, "ERR_BACKEND_UNAVAILABLE", reason);
  if (!has_appended_entries(cuda))
    throw_error(env, "ERR_BACKEND_UNAVAILABLE",
                "the CUDA plugin " + cuda_plugin().path + " predates device buffers and NCCL communicators (its table has " +
                    std::to_string(cuda->header.table_size) + " bytes, " + std::to_string(sizeof(sapipe_cuda_plugin_v1)) +
                    " are needed): rebuild it with `npm run build:native`");
  return cuda;
}

const sapipe_cuda_plugin_v1* require_device(Napi::Env env, int32_t device) {
  std::string reason;
  const sapipe_cuda_plugin_v1* cuda = plugin_or_null(&reason);
  if (cuda == nullptr) throw_error(env, "ERR_BACKEND_UNAVAILABLE", reason);
  if (cuda->set_device(device) != SAPIPE_OK)
    throw_error(env, "ERR_BACKEND_UNAVAILABLE", "cuda:" + std::to_string(device) + " is unavailable: " + cuda->last_error());
  return cuda;
}

Napi::Value CudaBenchUpdate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsNumber() || !info[2].IsNumber() || !info[3].IsNumber() || !info[4].IsNumber())
    throw_error(env, "ERR_INVALID_ARGUMENT", "cudaBenchUpdate(device, config, elements, reps, warmup): numbers expected");
  const double device = info[0].As<Napi::Number>().DoubleValue();
  const double elements = info[2].As<Napi::Number>().DoubleValue();
  const double reps = info[3].As<Napi::Number>().DoubleValue();
  const double warmup = info[4].As<Napi::Number>().DoubleValue();
  auto whole = [](double x, double lo, double hi) { return x >= lo && x <= hi && x == static_cast<double>(static_cast<int64_t>(x)); };
  if (!whole(device, 0, 1024) || !whole(elements, 1, 9007199254740991.0) || !whole(reps, 1, 1e6) || !whole(warmup, 0, 1e6))
    throw_error(env, "ERR_INVALID_ARGUMENT", "cudaBenchUpdate: device, elements, reps and warmup must be whole numbers in range");
  const sapipe_update_config config = parse_update_config(expect_object(env, info[1], "config"));
  const sapipe_cuda_plugin_v1* cuda = require_device(env, static_cast<int32_t>(device));
  sapipe_cuda_bench_result r{};
  const sapipe_status s = cuda->bench_update(&config, static_cast<size_t>(elements), static_cast<int32_t>(reps),
                                             static_cast<int32_t>(warmup), &r);
  if (s != SAPIPE_OK) throw_error(env, sapipe_status_code(s), std::string("cudaBenchUpdate: ") + cuda->last_error());
  Napi::Object out = Napi::Object::New(env);
  out.Set("updateMs", r.update_ms);
  out.Set("guardedMs", r.guarded_ms);
  out.Set("copyMs", r.copy_ms);
  out.Set("bytesPerElement", r.bytes_per_element);
  return out;
}

}  // namespace

const sapipe_cuda_plugin_v1* require_device_table(Napi::Env env, int32_t device) {
  require_appended(env);
  return require_device(env, device);
}

const sapipe_cuda_plugin_v1* require_nccl_table(Napi::Env env) {
  const sapipe_cuda_plugin_v1* cuda = require_appended(env);
  if (cuda->nccl_probe(nullptr, nullptr) != SAPIPE_OK) throw_error(env, "ERR_BACKEND_UNAVAILABLE", cuda->last_error());
  return cuda;
}

void InitCuda(Napi::Env env, Napi::Object exports) {
  exports.Set("cudaStatus", Napi::Function::New(env, CudaStatus, "cudaStatus"));
  exports.Set("ncclStatus", Napi::Function::New(env, NcclStatus, "ncclStatus"));
  exports.Set("cublasStatus", Napi::Function::New(env, CublasStatus, "cublasStatus"));
  exports.Set("cudaBenchUpdate", Napi::Function::New(env, CudaBenchUpdate, "cudaBenchUpdate"));
}

}  // namespace sapipe::addon
