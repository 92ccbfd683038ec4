#pragma once
#include <napi.h>
namespace sapipe::addon {
void InitNn(Napi::Env env, Napi::Object exports);
}
