// Module entry: registers the classes and functions lib/native.ts loads.
#include <napi.h>

#include <mutex>

#if defined(_WIN32)
#include <windows.h>
#else
#include <dlfcn.h>
#endif

#include "../core/host_kernels.h"
#include "../core/thread_pool.h"
#include "addon_data.h"
#include "comm_local_binding.h"
#include "comm_ucx_binding.h"
#include "device/comm_nccl_binding.h"
#include "device/cuda_events.h"
#include "device/cuda_stream.h"
#include "device/cuda_binding.h"
#include "device/cuda_buffer.h"
#include "kernels_binding.h"
#include "native_buffer.h"
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
  o.Set("simd", core::host_kernels_simd());
  o.Set("simdSupported", core::host_simd_supported());
  o.Set("threads", ThreadPool::global().size());
  o.Set("alignment", static_cast<double>(AlignedBuffer::kAlignment));
  return o;
}

// bindKernelThreads(n): the calling JS thread's kernels get a pool of n threads of their own
// (0: the process-wide pool again); returns the threads its kernels now use. The argument is
// checked in lib/kernel-threads.ts.
Napi::Value BindKernelThreads(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 1 || !info[0].IsNumber()) {
    Napi::TypeError::New(env, "bindKernelThreads(threads)").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  const int threads = info[0].As<Napi::Number>().Int32Value();
  try {
    return Napi::Number::New(env, ThreadPool::bind_to_this_thread(threads));
  } catch (const std::bad_alloc&) {
    Napi::Error::New(env, "bindKernelThreads: out of memory").ThrowAsJavaScriptException();
    return env.Undefined();
  }
}

// The calling thread's own pool's threads, or 0 where its kernels use the process-wide pool.
Napi::Value KernelThreads(const Napi::CallbackInfo& info) {
  const std::shared_ptr<ThreadPool> own = ThreadPool::bound();
  return Napi::Number::New(info.Env(), own ? own->size() : 0);
}

// Native threads of this library outlive any one environment: the global thread pool is never
// destroyed, and an execution queue's worker may finish an operation after its environment's
// cleanup. Node.js unloads an addon when the last environment that loaded it goes away (the last
// worker thread ends while the main thread never loaded it), which would unmap code those threads
// are running. Pin the library for the life of the process instead.
void PinLibrary() {
  static std::once_flag once;
  std::call_once(once, [] {
#if defined(_WIN32)
    HMODULE self = nullptr;
    GetModuleHandleExW(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_PIN,
                       reinterpret_cast<LPCWSTR>(&PinLibrary), &self);
#else
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&PinLibrary), &info) != 0 && info.dli_fname != nullptr)
      (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);  // never closed
#endif
  });
}

}  // namespace
}  // namespace sapipe::addon

static Napi::Object InitSapipe(Napi::Env env, Napi::Object exports) {
  using namespace sapipe::addon;
  PinLibrary();
  env.SetInstanceData(new AddonData());
  NativeBuffer::Init(env, exports);
  Queue::Init(env, exports);
  InitUpdate(env, exports);
  InitKernels(env, exports);
  InitNn(env, exports);
  InitCuda(env, exports);
  InitCudaBuffer(env, exports);
  InitNcclComm(env, exports);
  CudaEvents::Init(env, exports);
  CudaStream::Init(env, exports);
  InitCommLocal(env, exports);
  InitCommUcx(env, exports);
  exports.Set("info", Napi::Function::New(env, Info, "info"));
  exports.Set("bindKernelThreads", Napi::Function::New(env, BindKernelThreads, "bindKernelThreads"));
  exports.Set("kernelThreads", Napi::Function::New(env, KernelThreads, "kernelThreads"));
  return exports;
}

NODE_API_MODULE(sapipe, InitSapipe)
