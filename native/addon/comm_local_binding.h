#pragma once
#include <napi.h>
namespace sapipe::addon {
// LocalComm (one rank of an in-process group) and copySingleThread (the bandwidth reference of
// `sapipe bench allreduce`).
void InitCommLocal(Napi::Env env, Napi::Object exports);
}
