// cuBLAS opened at run time (libcublas.so.N), so neither the CUDA plugin nor the addon needs
// cuBLAS to build or load, as with NCCL (nccl_loader.h). Only the few entry points the model
// operations use are resolved; their types are declared here from cuBLAS's stable C ABI
// (cublas_api.h of cuBLAS 11 and later), so no cuBLAS headers are required.
#pragma once

#include <string>

#include "sapipe/status.h"

namespace sapipe::cublas {

// From cublas_api.h; values are part of cuBLAS's ABI.
using Status = int;  // cublasStatus_t: 0 is CUBLAS_STATUS_SUCCESS
constexpr Status kSuccess = 0;
using Handle = struct cublasContext*;
enum Operation : int { kOpN = 0, kOpT = 1 };  // cublasOperation_t
enum Property : int { kMajor = 0, kMinor = 1, kPatch = 2 };  // libraryPropertyType

struct Api {
  Status (*Create)(Handle* handle);
  Status (*Destroy)(Handle handle);
  Status (*SetStream)(Handle handle, void* stream);
  // Column-major, as every BLAS: C = alpha op(A) op(B) + beta C.
  Status (*Sgemm)(Handle handle, Operation transa, Operation transb, int m, int n, int k, const float* alpha, const float* a,
                  int lda, const float* b, int ldb, const float* beta, float* c, int ldc);
  Status (*GetProperty)(Property type, int* value);
  int version;       // major * 10000 + minor * 100 + patch, as cublasGetVersion reports it
  std::string path;  // the file that was opened
};

// Opens cuBLAS once per process: the folders or files of search_path (SAPIPE_CUBLAS_PATH's
// value, colon-separated; may be null) first, then libcublas.so.<preferred_major> and the other
// majors from 13 down to 11 on the dynamic linker's path and in the CUDA toolkit's usual folder.
// On failure returns SAPIPE_ERR_BACKEND_UNAVAILABLE and sets *reason to every place looked at
// and why each failed (or the symbol that was missing), and what to install.
sapipe_status load(const char* search_path, int preferred_major, const Api** api, std::string* reason);

// The same, without caching: for tests of the failure paths.
sapipe_status load_uncached(const char* search_path, int preferred_major, Api* api, std::string* reason);

}  // namespace sapipe::cublas
