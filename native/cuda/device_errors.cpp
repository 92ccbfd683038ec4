#include "device_errors.h"

namespace sapipe::cuda {
namespace {
thread_local std::string last_error;
}

sapipe_status fail(sapipe_status status, const std::string& message) {
  last_error = message;
  return status;
}

sapipe_status from_cuda(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return SAPIPE_OK;
  sapipe_status status = SAPIPE_ERR_INTERNAL;
  switch (error) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorStubLibrary:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      status = SAPIPE_ERR_BACKEND_UNAVAILABLE;
      break;
    case cudaErrorMemoryAllocation: status = SAPIPE_ERR_OUT_OF_MEMORY; break;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer: status = SAPIPE_ERR_INVALID_ARGUMENT; break;
    default: break;
  }
  return fail(status, std::string(what) + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")");
}

sapipe_status check_launch(const char* what) { return from_cuda(cudaGetLastError(), what); }

void clear_last_error() { last_error.clear(); }
const char* last_error_message() { return last_error.c_str(); }

}  // namespace sapipe::cuda
