// Launch geometry and vector access shared by every kernel of the plugin. Kernels are grid-stride
// loops over float4 groups (16-byte loads and stores) followed by a scalar tail, launched with no
// more blocks than keep every multiprocessor busy: one launch covers a whole ParamSet or bucket.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace sapipe::cuda {

constexpr int kThreads = 256;
// Blocks per multiprocessor a grid-stride kernel needs to hide memory latency on every
// architecture from Volta on (2048 resident threads per SM at most: 8 blocks of 256).
constexpr int kBlocksPerSm = 8;

// Blocks for `items` work items (one per thread per pass), capped at a full wave of the device.
unsigned int grid_for(size_t items);

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

#ifdef __CUDACC__
// Sum of x over the 32 lanes of a warp, in lane 0 (every lane must take part).
template <class T>
__device__ __forceinline__ T warp_sum(T x) {
  for (int d = 16; d > 0; d /= 2) x += __shfl_down_sync(0xffffffffu, x, d);
  return x;
}
#endif

// Grid-stride iteration over [begin, end).
#define SAPIPE_GRID_STRIDE(i, begin, end)                                                  \
  for (size_t i = (begin) + static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (end); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

}  // namespace sapipe::cuda
