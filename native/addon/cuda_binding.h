#pragma once

#include <napi.h>

namespace sapipe::addon {

// cudaStatus(), ncclStatus(), cudaBenchUpdate(device, config, elements, reps, warmup).
void InitCuda(Napi::Env env, Napi::Object exports);

}  // namespace sapipe::addon
