#pragma once
#include <napi.h>
namespace sapipe::addon {
void InitKernels(Napi::Env env, Napi::Object exports);
}
