// Module entry: registers the classes and functions lib/native.ts loads.
#include <napi.h>

#include "../core/thread_pool.h"
#include "../cpu/simd.h"
#include "addon_data.h"
#include "cuda_binding.h"
#include "cuda_buffer.h"
#include "comm_local_binding.h"
#include "kernels_binding.h"
#include "native_buffer.h"
#include "nccl_comm_binding.h"
#include "nn_binding.h"
#include "queue.h"
#include "update_binding.h"

namespace sapipe::addon {
namespace {

constexpr int kAbiVersion = 1;

Napi::Value Info(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
  o.Set("abiVersion", kAbiVersion);
  o.Set("simd", cpu::simd_name(cpu::active_simd()));
  o.Set("simdSupported", cpu::simd_name(cpu::best_supported_simd()));
  o.Set("threads", ThreadPool::global().size());
  o.Set("alignment", static_cast<double>(AlignedBuffer::kAlignment));
  return o;
}

}  // namespace
}  // namespace sapipe::addon

static Napi::Object InitSapipe(Napi::Env env, Napi::Object exports) {
  using namespace sapipe::addon;
  env.SetInstanceData(new AddonData());
  NativeBuffer::Init(env, exports);
  Queue::Init(env, exports);
  InitUpdate(env, exports);
  InitKernels(env, exports);
  InitNn(env, exports);
  InitCuda(env, exports);
  InitCudaBuffer(env, exports);
  InitNcclComm(env, exports);
  InitCommLocal(env, exports);
  exports.Set("info", Napi::Function::New(env, Info, "info"));
  return exports;
}

NODE_API_MODULE(sapipe, InitSapipe)
