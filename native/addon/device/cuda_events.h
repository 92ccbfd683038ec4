// CudaEvents: a fixed number of CUDA events on one device, recorded on the device's legacy default
// stream (where the model operations run). The data-parallel trainer records one per gradient
// bucket as its backward pass enqueues it, and the NCCL step waits for each on the GPU before that
// bucket's reduction (NcclComm.fusedUpdate's events). The events outlive their JS object while a
// queued step holds them.
#pragma once

#include <napi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "sapipe/plugin.h"

namespace sapipe::addon {

struct EventSet {
  const sapipe_cuda_plugin_v1* cuda = nullptr;
  int32_t device = 0;
  std::vector<void*> events;
  ~EventSet();
};

class CudaEvents : public Napi::ObjectWrap<CudaEvents> {
 public:
  static void Init(Napi::Env env, Napi::Object exports);
  // The events behind a JS value, or a thrown ERR_INVALID_ARGUMENT / ERR_DISPOSED naming `what`.
  static std::shared_ptr<EventSet> FromValue(Napi::Env env, const Napi::Value& value, const char* what);

  explicit CudaEvents(const Napi::CallbackInfo& info);

 private:
  Napi::Value GetCount(const Napi::CallbackInfo& info);
  Napi::Value Record(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);

  std::shared_ptr<EventSet> set_;
  uint32_t count_ = 0;
};

}  // namespace sapipe::addon
