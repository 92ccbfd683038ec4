// Reductions accumulate per thread, then per warp with shuffles, then one atomic per warp into
// the device result: one pass over memory and no second kernel.
#include "device_errors.h"
#include "launch.cuh"
#include "reduce.cuh"

namespace sapipe::cuda {
namespace {

__device__ __forceinline__ unsigned int non_finite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

__global__ void count_non_finite_kernel(const float* x, size_t n, size_t groups, unsigned long long* out) {
  unsigned long long bad = 0;
  SAPIPE_GRID_STRIDE(q, 0, groups) {
    const float4 v = reinterpret_cast<const float4*>(x)[q];
    bad += non_finite(v.x) + non_finite(v.y) + non_finite(v.z) + non_finite(v.w);
  }
  SAPIPE_GRID_STRIDE(i, groups * 4, n) bad += non_finite(x[i]);
  bad = warp_sum(bad);
  if ((threadIdx.x & 31) == 0 && bad != 0) atomicAdd(out, bad);
}

// Up to kMaxInputs inputs per launch, passed by value; more inputs take further passes that
// accumulate into out.
constexpr int kMaxInputs = 8;
struct SumInputs {
  const float* p[kMaxInputs];
  int k;
};

// out = (first ? 0 : out) + sum of inputs, times scale; counts non-finite results when count set.
__global__ void sum_kernel(float* out, SumInputs in, bool accumulate, size_t n, size_t groups, float scale,
                           unsigned long long* count) {
  unsigned long long bad = 0;
  SAPIPE_GRID_STRIDE(q, 0, groups) {
    float4 acc = accumulate ? reinterpret_cast<const float4*>(out)[q] : reinterpret_cast<const float4*>(in.p[0])[q];
    for (int j = accumulate ? 0 : 1; j < in.k; ++j) {
      const float4 x = reinterpret_cast<const float4*>(in.p[j])[q];
      acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
    }
    acc.x *= scale, acc.y *= scale, acc.z *= scale, acc.w *= scale;
    reinterpret_cast<float4*>(out)[q] = acc;
    bad += non_finite(acc.x) + non_finite(acc.y) + non_finite(acc.z) + non_finite(acc.w);
  }
  SAPIPE_GRID_STRIDE(i, groups * 4, n) {
    float acc = accumulate ? out[i] : in.p[0][i];
    for (int j = accumulate ? 0 : 1; j < in.k; ++j) acc += in.p[j][i];
    acc *= scale;
    out[i] = acc;
    bad += non_finite(acc);
  }
  if (count == nullptr) return;
  bad = warp_sum(bad);
  if ((threadIdx.x & 31) == 0 && bad != 0) atomicAdd(count, bad);
}

__global__ void scale_kernel(float* x, size_t n, size_t groups, float s) {
  SAPIPE_GRID_STRIDE(q, 0, groups) {
    float4 v = reinterpret_cast<float4*>(x)[q];
    v.x *= s, v.y *= s, v.z *= s, v.w *= s;
    reinterpret_cast<float4*>(x)[q] = v;
  }
  SAPIPE_GRID_STRIDE(i, groups * 4, n) x[i] *= s;
}

__global__ void axpy_kernel(float* y, const float* x, size_t n, size_t groups, float a) {
  SAPIPE_GRID_STRIDE(q, 0, groups) {
    float4 v = reinterpret_cast<float4*>(y)[q];
    const float4 u = reinterpret_cast<const float4*>(x)[q];
    v.x += a * u.x, v.y += a * u.y, v.z += a * u.z, v.w += a * u.w;
    reinterpret_cast<float4*>(y)[q] = v;
  }
  SAPIPE_GRID_STRIDE(i, groups * 4, n) y[i] += a * x[i];
}

__global__ void squared_norm_kernel(const float* x, size_t n, size_t groups, double* out) {
  // Each float4 is summed in float (four products), then added in double: one double add per
  // four elements keeps the sum of large buffers accurate at full memory speed.
  double total = 0.0;
  SAPIPE_GRID_STRIDE(q, 0, groups) {
    const float4 v = reinterpret_cast<const float4*>(x)[q];
    total += static_cast<double>(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
  }
  SAPIPE_GRID_STRIDE(i, groups * 4, n) total += static_cast<double>(x[i]) * x[i];
  total = warp_sum(total);
  if ((threadIdx.x & 31) == 0 && total != 0.0) atomicAdd(out, total);
}

size_t groups_of(size_t n, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (!aligned16(p)) return 0;
  return n / 4;
}

size_t items(size_t n, size_t groups) { return groups + (n - groups * 4); }

}  // namespace

void enqueue_count_non_finite(const float* x, size_t n, int64_t* count, cudaStream_t stream) {
  const size_t g = groups_of(n, {x});
  count_non_finite_kernel<<<grid_for(items(n, g)), kThreads, 0, stream>>>(x, n, g,
                                                                          reinterpret_cast<unsigned long long*>(count));
}

sapipe_status enqueue_count_non_finite_into(const float* x, size_t n, int64_t* device_out, cudaStream_t stream) {
  if (sapipe_status s = from_cuda(cudaMemsetAsync(device_out, 0, sizeof(int64_t), stream), "countNonFinite"); s != SAPIPE_OK)
    return s;
  if (n != 0) enqueue_count_non_finite(x, n, device_out, stream);
  return check_launch("countNonFinite kernel");
}

sapipe_status enqueue_sum(float* out, const float* const* inputs, size_t k, size_t n, float scale,
                          int64_t* device_non_finite, cudaStream_t stream) {
  auto* count = reinterpret_cast<unsigned long long*>(device_non_finite);
  if (count != nullptr)
    if (sapipe_status s = from_cuda(cudaMemsetAsync(count, 0, sizeof(int64_t), stream), "sum"); s != SAPIPE_OK) return s;
  if (n == 0) return SAPIPE_OK;
  bool aligned = aligned16(out);
  for (size_t j = 0; j < k; ++j) aligned = aligned && aligned16(inputs[j]);
  const size_t g = aligned ? n / 4 : 0;
  // Passes of at most kMaxInputs inputs; only the last scales and counts. Inputs are added in
  // their order, as the CPU kernel adds them.
  for (size_t first = 0; first < k; first += kMaxInputs) {
    SumInputs in{};
    in.k = static_cast<int>(k - first < static_cast<size_t>(kMaxInputs) ? k - first : kMaxInputs);
    for (int j = 0; j < in.k; ++j) in.p[j] = inputs[first + static_cast<size_t>(j)];
    const bool last = first + static_cast<size_t>(in.k) == k;
    sum_kernel<<<grid_for(items(n, g)), kThreads, 0, stream>>>(out, in, first != 0, n, g, last ? scale : 1.0f,
                                                              last ? count : nullptr);
  }
  return check_launch("sum kernel");
}

sapipe_status enqueue_scale(float* x, size_t n, float s, cudaStream_t stream) {
  if (n == 0) return SAPIPE_OK;
  const size_t g = groups_of(n, {x});
  scale_kernel<<<grid_for(items(n, g)), kThreads, 0, stream>>>(x, n, g, s);
  return check_launch("scale kernel");
}

sapipe_status enqueue_axpy(float* y, const float* x, size_t n, float a, cudaStream_t stream) {
  if (n == 0) return SAPIPE_OK;
  const size_t g = groups_of(n, {x, y});
  axpy_kernel<<<grid_for(items(n, g)), kThreads, 0, stream>>>(y, x, n, g, a);
  return check_launch("axpy kernel");
}

sapipe_status enqueue_squared_norm(const float* x, size_t n, double* device_out, cudaStream_t stream) {
  if (sapipe_status s = from_cuda(cudaMemsetAsync(device_out, 0, sizeof(double), stream), "squaredNorm"); s != SAPIPE_OK)
    return s;
  if (n == 0) return SAPIPE_OK;
  const size_t g = groups_of(n, {x});
  squared_norm_kernel<<<grid_for(items(n, g)), kThreads, 0, stream>>>(x, n, g, device_out);
  return check_launch("squaredNorm kernel");
}

}  // namespace sapipe::cuda
