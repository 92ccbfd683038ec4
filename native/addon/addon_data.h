// Per-environment state of the addon (constructors used for instanceof checks), so that the addon
// also works when loaded in several worker_threads at once.
#pragma once

#include <napi.h>

#include <cstdint>
#include <map>
#include <memory>

namespace sapipe::addon {

struct AddonData {
  Napi::FunctionReference native_buffer_ctor;
  Napi::FunctionReference queue_ctor;
  Napi::FunctionReference cuda_buffer_ctor;
  Napi::FunctionReference cuda_events_ctor;
  Napi::FunctionReference cuda_stream_ctor;
  // Device -> the stream this thread's device operations are enqueued on while a CudaStream's
  // run() is on the stack (absent: the legacy default stream). Held here so that disposing the
  // stream inside run() cannot free it while it is current.
  std::map<int32_t, std::shared_ptr<void>> current_streams;
  // The current stream of `device`, or nullptr (the legacy default stream).
  void* current_stream(int32_t device) const {
    auto it = current_streams.find(device);
    return it == current_streams.end() ? nullptr : it->second.get();
  }
  static AddonData& Get(Napi::Env env) { return *env.GetInstanceData<AddonData>(); }
};

}  // namespace sapipe::addon
