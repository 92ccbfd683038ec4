#include "device_errors.h"
#include "easgd.cuh"
#include "launch.cuh"

namespace sapipe::cuda {
namespace {

__device__ __forceinline__ void pull(float& x, float& c, float alpha) {
  const float d = alpha * (x - c);
  x -= d;
  c += d;
}

__global__ void elastic_average_kernel(float* x, float* c, size_t n, size_t groups, float alpha) {
  SAPIPE_GRID_STRIDE(q, 0, groups) {
    float4 a = reinterpret_cast<float4*>(x)[q], b = reinterpret_cast<float4*>(c)[q];
    pull(a.x, b.x, alpha), pull(a.y, b.y, alpha), pull(a.z, b.z, alpha), pull(a.w, b.w, alpha);
    reinterpret_cast<float4*>(x)[q] = a;
    reinterpret_cast<float4*>(c)[q] = b;
  }
  SAPIPE_GRID_STRIDE(i, groups * 4, n) pull(x[i], c[i], alpha);
}

}  // namespace

sapipe_status enqueue_elastic_average(float* worker, float* center, size_t n, float alpha, cudaStream_t stream) {
  if (n == 0) return SAPIPE_OK;
  const size_t g = aligned16(worker) && aligned16(center) ? n / 4 : 0;
  elastic_average_kernel<<<grid_for(g + (n - g * 4)), kThreads, 0, stream>>>(worker, center, n, g, alpha);
  return check_launch("elasticAverage kernel");
}

}  // namespace sapipe::cuda
