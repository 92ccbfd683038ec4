#pragma once
#include <napi.h>

#include <memory>
#include <vector>

#include "../core/aligned_buffer.h"
#include "sapipe/kernels.h"
namespace sapipe::addon {
void InitUpdate(Napi::Env env, Napi::Object exports);
// The update configuration from its JS form (NativeUpdateConfig in lib/native.ts); the kernels
// check the values.
sapipe_update_config parse_update_config(const Napi::Object& config);

// A step's configuration and buffers from their JS forms (NativeUpdateConfig, NativeUpdateBuffers),
// with the buffers' memory held while the step is queued.
struct ParsedUpdate {
  sapipe_update_config config{};
  sapipe_update_buffers buffers{};
  std::vector<std::shared_ptr<AlignedBuffer>> held;
};
ParsedUpdate parse_update(Napi::Env env, const Napi::Value& config, const Napi::Value& buffers);
}
