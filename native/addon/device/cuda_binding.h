#pragma once

#include <napi.h>

#include <cstdint>
#include <string>

#include "sapipe/plugin.h"

namespace sapipe::addon {

// cudaStatus(), ncclStatus(), cudaBenchUpdate(device, config, elements, reps, warmup).
void InitCuda(Napi::Env env, Napi::Object exports);

// The plugin with the entries appended to v1 (device buffers, NCCL), and `device` made current on
// the calling thread; otherwise throws ERR_BACKEND_UNAVAILABLE with the reason (no plugin, a plugin
// built before those entries, no driver, no such device).
const sapipe_cuda_plugin_v1* require_device_table(Napi::Env env, int32_t device);

// "cuda:N is unavailable: <why>" after the plugin failed to make `device` current: the plugin's
// own error, or, when several plugins were candidates and none can run here, each one's reason
// (as cudaStatus() gives it).
std::string device_unavailable(int32_t device, const sapipe_cuda_plugin_v1* cuda);

// The same check for NCCL, before any device is touched: the plugin, its appended entries, and
// libnccl.so.2 with every symbol needed (the reason lists where NCCL was looked for).
const sapipe_cuda_plugin_v1* require_nccl_table(Napi::Env env);

}  // namespace sapipe::addon
