// CudaStream: a stream of its own on one device (created non-blocking by the plugin, so it does
// not synchronise with the legacy default stream), for a pipeline stage that shares the device
// with other stages in this process. run(fn) makes it the device's current stream while fn runs
// synchronously: every device operation the addon enqueues meanwhile (model operations, copies,
// the fused update) goes on it. Order with other streams is by events only (record, wait).
#pragma once

#include <napi.h>

#include <cstdint>
#include <memory>

#include "sapipe/plugin.h"

namespace sapipe::addon {

class CudaStream : public Napi::ObjectWrap<CudaStream> {
 public:
  static void Init(Napi::Env env, Napi::Object exports);

  explicit CudaStream(const Napi::CallbackInfo& info);

 private:
  Napi::Value GetDevice(const Napi::CallbackInfo& info);
  Napi::Value Run(const Napi::CallbackInfo& info);
  Napi::Value Synchronize(const Napi::CallbackInfo& info);
  Napi::Value Query(const Napi::CallbackInfo& info);
  Napi::Value Record(const Napi::CallbackInfo& info);
  Napi::Value Wait(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  void* live(Napi::Env env, const char* what);

  const sapipe_cuda_plugin_v1* cuda_ = nullptr;
  int32_t device_ = 0;
  // The stream, destroyed with its last holder (this object, or the addon's current-stream slot
  // while a run() is on the stack).
  std::shared_ptr<void> stream_;
};

}  // namespace sapipe::addon
