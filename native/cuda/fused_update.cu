// One kernel per step covers the whole [offset, offset + count) range of every buffer: each
// thread loads a float4 of each buffer the step uses, runs the element maths of optim.cuh,
// compensate.cuh and predict.cuh on its four lanes in registers, and stores each output once.
// Every buffer is read or written exactly once, as ALGORITHMS.md counts the bytes.
//
// The non-finite guard stays all or nothing without a host round trip: a first kernel counts the
// non-finite gradient elements into a device word, and the update kernel, ordered after it on
// the same stream, reads that word and returns before writing anything when it is non-zero.
#include <cuda_bf16.h>

#include "device_errors.h"
#include "fused_update.cuh"
#include "launch.cuh"
#include "reduce.cuh"
#include "update_element.cuh"

namespace sapipe::cuda {
namespace {

struct DeviceBuffers {
  float* w;
  const float* g;
  float* m;
  float* v;
  float* backup;
  float* predicted;
  const float* local;
  float* prev_local;
  __nv_bfloat16* predicted_bf16;
  const float* w_in;  // out of place: the weights are read here and written to w (null: in place)
};

__device__ __forceinline__ float4 load4(const float* p, size_t i) {
  return p ? reinterpret_cast<const float4*>(p)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
}
__device__ __forceinline__ float& lane(float4& x, int k) { return (&x.x)[k]; }

__global__ void fused_update_kernel(UpdatePlan p, DeviceBuffers b, size_t count, size_t groups,
                                    const int64_t* guard) {
  if (guard != nullptr && *guard != 0) return;
  const bool prediction = p.prediction != SAPIPE_PREDICTION_NONE;
  SAPIPE_GRID_STRIDE(q, 0, groups) {
    float4 w = load4(b.w_in ? b.w_in : b.w, q), g = load4(b.g, q), m = load4(b.m, q), v = load4(b.v, q);
    float4 c = load4(b.backup, q), l = load4(b.local, q), pl = load4(b.prev_local, q);
    float4 wh;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      lane(wh, k) = update_element(p, lane(w, k), lane(g, k), lane(m, k), lane(v, k), lane(c, k), lane(l, k), lane(pl, k));
    reinterpret_cast<float4*>(b.w)[q] = w;
    if (b.m) reinterpret_cast<float4*>(b.m)[q] = m;
    if (b.v) reinterpret_cast<float4*>(b.v)[q] = v;
    if (b.backup) reinterpret_cast<float4*>(b.backup)[q] = c;
    if (b.prev_local) reinterpret_cast<float4*>(b.prev_local)[q] = pl;
    if (prediction) {
      reinterpret_cast<float4*>(b.predicted)[q] = wh;
      if (b.predicted_bf16) {
        // Four bf16 values: one 8-byte store.
        __nv_bfloat162 lo = __floats2bfloat162_rn(wh.x, wh.y), hi = __floats2bfloat162_rn(wh.z, wh.w);
        uint2 packed = make_uint2(*reinterpret_cast<unsigned int*>(&lo), *reinterpret_cast<unsigned int*>(&hi));
        reinterpret_cast<uint2*>(b.predicted_bf16)[q] = packed;
      }
    }
  }
  // Scalar tail (also the whole range when some buffer is not 16-byte aligned: groups = 0).
  SAPIPE_GRID_STRIDE(i, groups * 4, count) {
    float w = b.w_in ? b.w_in[i] : b.w[i], m = b.m ? b.m[i] : 0.f, v = b.v ? b.v[i] : 0.f, c = b.backup ? b.backup[i] : 0.f;
    float pl = b.prev_local ? b.prev_local[i] : 0.f;
    const float wh = update_element(p, w, b.g[i], m, v, c, b.local ? b.local[i] : 0.f, pl);
    b.w[i] = w;
    if (b.m) b.m[i] = m;
    if (b.v) b.v[i] = v;
    if (b.backup) b.backup[i] = c;
    if (b.prev_local) b.prev_local[i] = pl;
    if (prediction) {
      b.predicted[i] = wh;
      if (b.predicted_bf16) b.predicted_bf16[i] = __float2bfloat16_rn(wh);
    }
  }
}

template <class T>
T* at(T* p, size_t offset) {
  return p ? p + offset : nullptr;
}

}  // namespace

namespace {

DeviceBuffers device_buffers(const sapipe_update_config& config, const sapipe_update_buffers& buffers,
                             uint16_t* predicted_bf16) {
  const size_t o = buffers.offset;
  const bool prediction = config.prediction != SAPIPE_PREDICTION_NONE;
  return DeviceBuffers{
      buffers.weights + o,
      buffers.grad + o,
      core::uses_momentum_buffer(config) ? at(buffers.momentum, o) : nullptr,
      core::uses_second_moment(config) ? at(buffers.second_moment, o) : nullptr,
      config.compensation != SAPIPE_COMPENSATION_NONE ? at(buffers.backup, o) : nullptr,
      prediction ? at(buffers.predicted, o) : nullptr,
      core::update_reads_local_grad(config) ? at(buffers.local_grad, o) : nullptr,
      config.prediction == SAPIPE_PREDICTION_SHADOW_STEP && config.estimate == SAPIPE_ESTIMATE_LOCAL_PREV_SYNC
          ? at(buffers.prev_local_grad, o)
          : nullptr,
      prediction && predicted_bf16 ? reinterpret_cast<__nv_bfloat16*>(predicted_bf16 + o) : nullptr,
      at(buffers.weights_in, o)};
}

}  // namespace

sapipe_status enqueue_fused_update_guarded_by(const sapipe_update_config& config, const sapipe_update_buffers& buffers,
                                              uint16_t* predicted_bf16, const int64_t* skip_flag, cudaStream_t stream) {
  const size_t n = buffers.count;
  if (n == 0) return SAPIPE_OK;
  const DeviceBuffers b = device_buffers(config, buffers, predicted_bf16);
  const bool vector = aligned16(b.w) && (!b.w_in || aligned16(b.w_in)) && aligned16(b.g) && (!b.m || aligned16(b.m)) && (!b.v || aligned16(b.v)) &&
                      (!b.backup || aligned16(b.backup)) && (!b.predicted || aligned16(b.predicted)) &&
                      (!b.local || aligned16(b.local)) && (!b.prev_local || aligned16(b.prev_local)) &&
                      (!b.predicted_bf16 || (reinterpret_cast<uintptr_t>(b.predicted_bf16) & 7u) == 0);
  const size_t groups = vector ? n / 4 : 0;
  const size_t items = groups + (n - groups * 4);
  const core::UpdatePlan plan = core::make_update_plan(config);
  fused_update_kernel<<<grid_for(items), kThreads, 0, stream>>>(plan, b, n, groups, skip_flag);
  return check_launch("update kernel");
}

sapipe_status enqueue_fused_update(const sapipe_update_config& config, const sapipe_update_buffers& buffers,
                                   uint16_t* predicted_bf16, int64_t* guard_count, cudaStream_t stream) {
  if (config.grad_checked) return enqueue_fused_update_guarded_by(config, buffers, predicted_bf16, nullptr, stream);
  if (guard_count == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "update: guard_count is required unless grad_checked");
  if (sapipe_status s = from_cuda(cudaMemsetAsync(guard_count, 0, sizeof(int64_t), stream), "update: clear guard");
      s != SAPIPE_OK)
    return s;
  const size_t o = buffers.offset, n = buffers.count;
  if (n == 0) return SAPIPE_OK;
  enqueue_count_non_finite(buffers.grad + o, n, guard_count, stream);
  if (core::update_reads_local_grad(config)) enqueue_count_non_finite(buffers.local_grad + o, n, guard_count, stream);
  return enqueue_fused_update_guarded_by(config, buffers, predicted_bf16, guard_count, stream);
}

}  // namespace sapipe::cuda
