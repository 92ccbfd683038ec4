#pragma once
#include <napi.h>
namespace sapipe::addon {
// UcxComm (one rank of a group over the UCX transport plugin, opened lazily) and ucxStatus().
void InitCommUcx(Napi::Env env, Napi::Object exports);
}
