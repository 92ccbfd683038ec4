// The CUDA side of the model operations (sapipe/nn.h): element and row kernels, and the matrix
// product through cuBLAS (opened at run time by native/core/device/cublas_loader).
#pragma once

#include "sapipe/nn.h"

namespace sapipe::cuda {

// The table the plugin's nn_ops entry returns. Every entry enqueues on its stream and returns.
const sapipe_nn_ops* cuda_nn_ops();

// Opens cuBLAS unless already open (SAPIPE_CUBLAS_PATH first); the reason in last_error() when it cannot.
sapipe_status cublas_probe(int32_t* version, const char** library_path);

}  // namespace sapipe::cuda
