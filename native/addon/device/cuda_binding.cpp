// The CUDA plugin seen from JS: whether it loads and why not, its devices, NCCL, and the kernel
// benchmark. The plugin is opened on the first call (never at require time), so the addon loads
// on machines without CUDA; every failure becomes a status object or an ERR_BACKEND_UNAVAILABLE.
// What the table says (devices, libraries, appended entries) is read by native/core/device/cuda_plugin.h.
#include <string>

#include "../../core/device/cuda_plugin.h"
#include "../errors.h"
#include "../js_args.h"
#include "../update_binding.h"
#include "cuda_binding.h"
#include "sapipe/plugin.h"

namespace sapipe::addon {
namespace {

const sapipe_cuda_plugin_v1* plugin_or_null(std::string* reason) { return cuda_table(cuda_plugin(), reason); }

// {available, reason?, pluginPath, pluginChoice?, architectures?, runtimeVersion?, devices?}; never throws.
Napi::Value CudaStatus(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  std::string reason;
  const sapipe_cuda_plugin_v1* cuda = plugin_or_null(&reason);
  out.Set("pluginPath", cuda_plugin().path);
  if (!cuda_plugin().choice.empty()) out.Set("pluginChoice", cuda_plugin().choice);
  if (cuda == nullptr) {
    out.Set("available", false);
    out.Set("reason", reason);
    return out;
  }
  out.Set("architectures", cuda->build_architectures());
  out.Set("runtimeVersion", cuda->runtime_version());
  const CudaReport report = report_cuda_devices(cuda);
  if (report.counted) {
    Napi::Array devices = Napi::Array::New(env);
    for (size_t d = 0; d < report.devices.size(); ++d) {
      const CudaDeviceReport& device = report.devices[d];
      const sapipe_cuda_device_info& di = device.info;
      Napi::Object o = Napi::Object::New(env);
      if (device.listed) {
        o.Set("name", di.name);
        o.Set("computeCapability", std::to_string(di.major) + "." + std::to_string(di.minor));
        o.Set("multiprocessors", di.multiprocessors);
        o.Set("totalMemory", static_cast<double>(di.total_memory));
        o.Set("kernelsAvailable", di.kernels_available != 0);
      } else {
        o.Set("error", device.error);
      }
      devices.Set(static_cast<uint32_t>(d), o);
    }
    out.Set("devices", devices);
  }
  out.Set("available", report.available);
  // Several plugins and none can run here: each one's reason, not only the kept one's.
  if (!report.available) out.Set("reason", cuda_plugin().candidates_reason.empty() ? report.reason : cuda_plugin().candidates_reason);
  return out;
}

// {available, reason?, version?, path?} of a library the CUDA plugin opens at run time; never throws.
Napi::Value LibraryStatus(Napi::Env env, CudaLibrary library) {
  std::string reason;
  const sapipe_cuda_plugin_v1* cuda = plugin_or_null(&reason);
  const CudaLibraryReport report = report_cuda_library(cuda, reason, library);
  Napi::Object out = Napi::Object::New(env);
  out.Set("available", report.available);
  if (report.available) {
    out.Set("version", report.version);
    out.Set("path", report.path);
  } else {
    out.Set("reason", report.reason);
  }
  return out;
}

Napi::Value NcclStatus(const Napi::CallbackInfo& info) { return LibraryStatus(info.Env(), CudaLibrary::kNccl); }

// cuBLAS, which the plugin's model operations open for their products.
Napi::Value CublasStatus(const Napi::CallbackInfo& info) { return LibraryStatus(info.Env(), CudaLibrary::kCublas); }

const sapipe_cuda_plugin_v1* require_appended(Napi::Env env) {
  std::string reason;
  const sapipe_cuda_plugin_v1* cuda = plugin_or_null(&reason);
  if (cuda == nullptr) throw_error(env, "ERR_BACKEND_UNAVAILABLE", reason);
  if (!has_device_entries(cuda, cuda_plugin().path, &reason)) throw_error(env, "ERR_BACKEND_UNAVAILABLE", reason);
  return cuda;
}

const sapipe_cuda_plugin_v1* require_device(Napi::Env env, int32_t device) {
  std::string reason;
  const sapipe_cuda_plugin_v1* cuda = plugin_or_null(&reason);
  if (cuda == nullptr) throw_error(env, "ERR_BACKEND_UNAVAILABLE", reason);
  if (cuda->set_device(device) != SAPIPE_OK) throw_error(env, "ERR_BACKEND_UNAVAILABLE", device_unavailable(device, cuda));
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

std::string device_unavailable(int32_t device, const sapipe_cuda_plugin_v1* cuda) {
  const std::string& candidates = cuda_plugin().candidates_reason;
  return "cuda:" + std::to_string(device) + " is unavailable: " + (candidates.empty() ? std::string(cuda->last_error()) : candidates);
}

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
