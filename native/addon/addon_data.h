// Per-environment state of the addon (constructors used for instanceof checks), so that the addon
// also works when loaded in several worker_threads at once.
#pragma once

#include <napi.h>

namespace sapipe::addon {

struct AddonData {
  Napi::FunctionReference native_buffer_ctor;
  Napi::FunctionReference queue_ctor;
  Napi::FunctionReference cuda_buffer_ctor;
  Napi::FunctionReference cuda_events_ctor;
  static AddonData& Get(Napi::Env env) { return *env.GetInstanceData<AddonData>(); }
};

}  // namespace sapipe::addon
