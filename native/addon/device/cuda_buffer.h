// CudaBuffer: fp32 memory on one CUDA device, owned by native code (lib/device/buffer.ts wraps it
// as DeviceBuffer; the memory is core's DeviceAllocation, native/core/device/device_memory.h).
// Copies to and from host memory are synchronous; dispose() frees at once unless a queued
// collective still uses the memory (ERR_BUSY). Also cudaUpdate(): the fused update on device buffers.
#pragma once

#include <napi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "../../core/device/device_memory.h"
#include "sapipe/plugin.h"

namespace sapipe::addon {

class CudaBuffer : public Napi::ObjectWrap<CudaBuffer> {
 public:
  static void Init(Napi::Env env, Napi::Object exports);
  // The allocation behind a JS value, or a thrown ERR_INVALID_ARGUMENT / ERR_DISPOSED naming `what`.
  static std::shared_ptr<DeviceAllocation> FromValue(Napi::Env env, const Napi::Value& value, const char* what);

  explicit CudaBuffer(const Napi::CallbackInfo& info);

 private:
  Napi::Value GetLength(const Napi::CallbackInfo& info);
  Napi::Value GetDevice(const Napi::CallbackInfo& info);
  Napi::Value GetDisposed(const Napi::CallbackInfo& info);
  Napi::Value CopyFromHost(const Napi::CallbackInfo& info);
  Napi::Value CopyToHost(const Napi::CallbackInfo& info);
  Napi::Value CopyHost(const Napi::CallbackInfo& info, bool to_device);
  Napi::Value CopyFromDevice(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  DeviceAllocation& live(Napi::Env env, const char* what);

  std::shared_ptr<DeviceAllocation> memory_;
  size_t length_ = 0;
  int32_t device_ = 0;
};

// A fused update's buffers from their JS form (the keys of NativeUpdateBuffers, CudaBuffers for
// values), all on `device` (-1: the weights' device) and of the weights' length, with the memory
// held. refuse_busy: ERR_BUSY for memory a queued operation uses (for work run at once).
struct DeviceUpdate {
  sapipe_update_buffers buffers{};
  std::vector<std::shared_ptr<DeviceAllocation>> held;  // the weights first
};
DeviceUpdate parse_device_update(Napi::Env env, const Napi::Value& buffers, int32_t device, bool refuse_busy);

// CudaBuffer, cudaUpdate(config, buffers), cudaCountNonFinite(buffer, offset, count).
void InitCudaBuffer(Napi::Env env, Napi::Object exports);

}  // namespace sapipe::addon
