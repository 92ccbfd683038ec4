#include "device_runtime.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstring>
#include <sstream>
#include <string>

#include "device_errors.h"
#include "launch.cuh"

#ifndef SAPIPE_CUDA_ARCHITECTURES
#define SAPIPE_CUDA_ARCHITECTURES "unknown"
#endif

namespace sapipe::cuda {
namespace {

// The statically linked runtime opens the driver itself; opening it first lets the reason name
// the library when it is missing, instead of the runtime's "insufficient driver".
// The dlopen is tried once, and its error text kept with it: dlerror() reports an error only
// once, so a later call would otherwise lose the reason.
sapipe_status check_driver() {
  static const std::string failure = [] {
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) != nullptr) return std::string();
    const char* why = dlerror();
    return std::string(why ? why : "dlopen failed");
  }();
  if (failure.empty()) return SAPIPE_OK;
  return fail(SAPIPE_ERR_BACKEND_UNAVAILABLE, "the NVIDIA driver library libcuda.so.1 was not found (" + failure +
                                                  "): install the NVIDIA driver, or run where a GPU is present");
}

// Whether this plugin carries code for compute capability major.minor: SASS of the same major
// and a minor at most this one, or PTX of a lower or equal capability (JIT-compiled by the driver).
bool have_code_for(int major, int minor) {
  const int cc = major * 10 + minor;
  std::istringstream in(SAPIPE_CUDA_ARCHITECTURES);
  std::string token;
  while (in >> token) {
    const bool ptx = token.rfind("compute_", 0) == 0;
    const int arch = std::atoi(token.c_str() + (ptx ? 8 : 3));
    if (ptx ? arch <= cc : (arch / 10 == major && arch <= cc)) return true;
  }
  return false;
}

}  // namespace

unsigned int grid_for(size_t items) {
  static thread_local int sms = 0;
  if (sms == 0) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0)
      sms = 80;
  }
  const size_t wanted = (items + kThreads - 1) / kThreads;
  const size_t cap = static_cast<size_t>(sms) * kBlocksPerSm;
  return static_cast<unsigned int>(wanted == 0 ? 1 : (wanted < cap ? wanted : cap));
}

sapipe_status device_count(int32_t* count) {
  if (count == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "deviceCount: count is null");
  *count = 0;
  if (sapipe_status s = check_driver(); s != SAPIPE_OK) return s;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0))
    return fail(SAPIPE_ERR_BACKEND_UNAVAILABLE, "no CUDA device is visible (libcuda.so.1 loaded; check CUDA_VISIBLE_DEVICES and nvidia-smi)");
  if (e == cudaErrorInsufficientDriver) {
    // The driver is older than this plugin's runtime (CUDA 13 needs driver 580 or newer, 11.8
    // needs 520): name both, so that the report says which plugin or driver would serve.
    int driver = 0;
    const std::string supports = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0
                                     ? "supports CUDA " + std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10)
                                     : "is too old";
    return fail(SAPIPE_ERR_BACKEND_UNAVAILABLE, "the NVIDIA driver (libcuda.so.1) " + supports + ", older than this plugin's runtime, CUDA " +
                                                    std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10) +
                                                    " (cudaErrorInsufficientDriver): update the driver, or use a plugin built with an older toolkit");
  }
  if (sapipe_status s = from_cuda(e, "cudaGetDeviceCount"); s != SAPIPE_OK) return s;
  *count = n;
  return SAPIPE_OK;
}

sapipe_status device_info(int32_t device, sapipe_cuda_device_info* out) {
  if (out == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "deviceInfo: out is null");
  int32_t n = 0;
  if (sapipe_status s = device_count(&n); s != SAPIPE_OK) return s;
  if (device < 0 || device >= n)
    return fail(SAPIPE_ERR_INVALID_ARGUMENT, "device " + std::to_string(device) + " does not exist (" + std::to_string(n) + " visible)");
  cudaDeviceProp prop{};
  if (sapipe_status s = from_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"); s != SAPIPE_OK) return s;
  std::memset(out, 0, sizeof *out);
  const size_t len = strnlen(prop.name, sizeof prop.name);
  std::memcpy(out->name, prop.name, len < sizeof out->name ? len : sizeof out->name - 1);
  out->major = prop.major;
  out->minor = prop.minor;
  out->multiprocessors = prop.multiProcessorCount;
  out->total_memory = prop.totalGlobalMem;
  out->kernels_available = have_code_for(prop.major, prop.minor) ? 1 : 0;
  return SAPIPE_OK;
}

const char* build_architectures() { return SAPIPE_CUDA_ARCHITECTURES; }

}  // namespace sapipe::cuda
