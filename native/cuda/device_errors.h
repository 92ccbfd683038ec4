// CUDA runtime errors as sapipe_status, with the details kept per thread for last_error(). A
// missing driver or device is SAPIPE_ERR_BACKEND_UNAVAILABLE, so callers report it as such.
#pragma once

#include <cuda_runtime.h>

#include <exception>
#include <new>
#include <string>

#include "sapipe/status.h"

namespace sapipe::cuda {

// Stores message as the thread's last error and returns status.
sapipe_status fail(sapipe_status status, const std::string& message);
sapipe_status from_cuda(cudaError_t error, const char* what);
// The status of the launches just made (a bad launch configuration or an earlier fault).
sapipe_status check_launch(const char* what);
void clear_last_error();
const char* last_error_message();

// Runs body, turning any C++ exception into a status: nothing may unwind across the C ABI.
template <class Body>
sapipe_status guarded(const char* what, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(SAPIPE_ERR_OUT_OF_MEMORY, std::string(what) + ": out of host memory");
  } catch (const std::exception& e) {
    return fail(SAPIPE_ERR_INTERNAL, std::string(what) + ": " + e.what());
  } catch (...) {
    return fail(SAPIPE_ERR_INTERNAL, std::string(what) + ": unknown error");
  }
}

}  // namespace sapipe::cuda
