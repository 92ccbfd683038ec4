// The qualifier of the per-element maths (optim.cuh, compensate.cuh, predict.cuh,
// update_element.cuh): device and host functions under nvcc, plain inline functions under a host
// compiler, so that the CUDA element maths also compiles into native/tests/cuda_math_check.cpp
// and is checked on the CPU against the scalar reference on every machine.
#pragma once

#include <math.h>

#ifdef __CUDACC__
#define SAPIPE_ELEMENT __host__ __device__ __forceinline__
#else
#define SAPIPE_ELEMENT inline
#endif
