#pragma once
#include <napi.h>

#include "sapipe/kernels.h"
namespace sapipe::addon {
void InitUpdate(Napi::Env env, Napi::Object exports);
// The update configuration from its JS form (NativeUpdateConfig in lib/native.ts); the kernels
// check the values.
sapipe_update_config parse_update_config(const Napi::Object& config);
}
