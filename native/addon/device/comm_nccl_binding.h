#pragma once

#include <napi.h>

namespace sapipe::addon {

// NcclComm (one rank's NCCL communicator on one device; lib/comm/nccl.ts wraps it) and
// ncclUniqueId().
void InitNcclComm(Napi::Env env, Napi::Object exports);

}  // namespace sapipe::addon
