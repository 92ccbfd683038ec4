#pragma once
#include <napi.h>
namespace sapipe::addon {
void InitUpdate(Napi::Env env, Napi::Object exports);
}
