#include "bucket_update.h"

#include <string>

#include "device_errors.h"
#include "fused_update.cuh"
#include "launch.cuh"
#include "reduce.cuh"

namespace sapipe::cuda {
namespace {

__global__ void count_to_float_kernel(const int64_t* count, float* out) { *out = static_cast<float>(*count); }
// The update kernel's guard is an int64: non-zero when any rank saw a non-finite gradient.
__global__ void float_to_flag_kernel(const float* global, int64_t* flag) { *flag = *global != 0.0f ? 1 : 0; }

sapipe_status from_nccl(const nccl::Api& api, nccl::Result r, const char* what) {
  if (r == nccl::kSuccess || r == nccl::kInProgress) return SAPIPE_OK;
  return fail(SAPIPE_ERR_INTERNAL, std::string(what) + ": " + (api.GetErrorString ? api.GetErrorString(r) : "NCCL error"));
}

}  // namespace

sapipe_status enqueue_bucketed_update(const BucketedUpdate& run, const sapipe_update_config& config,
                                      const sapipe_update_buffers* buffers, size_t num_buckets) {
  if (run.nccl == nullptr || run.comm == nullptr || run.reduced == nullptr || run.scratch == nullptr || buffers == nullptr)
    return fail(SAPIPE_ERR_INVALID_ARGUMENT, "bucketed update: missing communicator, events, scratch or buffers");
  auto* words = static_cast<int64_t*>(run.scratch);
  float* global_bad = reinterpret_cast<float*>(words + 0);
  int64_t* local_bad = words + 1;
  int64_t* flag = words + 2;
  int64_t* overflow = words + 3;
  const nccl::Api& api = *run.nccl;
  cudaStream_t cs = run.comm_stream;
  // 1. This rank's non-finite count over every bucket, all-reduced as one float.
  if (sapipe_status s = from_cuda(cudaMemsetAsync(run.scratch, 0, kBucketedUpdateScratchBytes, cs), "bucketed update");
      s != SAPIPE_OK)
    return s;
  for (size_t i = 0; i < num_buckets; ++i)
    enqueue_count_non_finite(buffers[i].grad + buffers[i].offset, buffers[i].count, local_bad, cs);
  count_to_float_kernel<<<1, 1, 0, cs>>>(local_bad, global_bad);
  if (sapipe_status s = from_nccl(api, api.AllReduce(global_bad, global_bad, 1, nccl::kFloat32, nccl::kSum, run.comm, cs),
                                  "ncclAllReduce (guard)");
      s != SAPIPE_OK)
    return s;
  float_to_flag_kernel<<<1, 1, 0, cs>>>(global_bad, flag);
  // 2. Per bucket: all-reduce in place, count overflow of the sum, record the bucket's event.
  for (size_t i = 0; i < num_buckets; ++i) {
    float* grad = const_cast<float*>(buffers[i].grad) + buffers[i].offset;
    if (sapipe_status s = from_nccl(api, api.AllReduce(grad, grad, buffers[i].count, nccl::kFloat32, nccl::kSum, run.comm, cs),
                                    "ncclAllReduce (bucket)");
        s != SAPIPE_OK)
      return s;
    enqueue_count_non_finite(grad, buffers[i].count, overflow, cs);
    if (sapipe_status s = from_cuda(cudaEventRecord(run.reduced[i], cs), "cudaEventRecord"); s != SAPIPE_OK) return s;
  }
  // 3. Each bucket's update waits for its own all-reduce only; all read the one guard flag, which
  //    the first event already covers.
  sapipe_update_config c = config;
  c.grad_checked = 1;  // the guard is the all-reduced flag below, not a scan of this bucket
  for (size_t i = 0; i < num_buckets; ++i) {
    if (sapipe_status s = from_cuda(cudaStreamWaitEvent(run.compute_stream, run.reduced[i], 0), "cudaStreamWaitEvent");
        s != SAPIPE_OK)
      return s;
    if (sapipe_status s = enqueue_fused_update_guarded_by(c, buffers[i], nullptr, flag, run.compute_stream); s != SAPIPE_OK)
      return s;
  }
  return check_launch("bucketed update");
}

}  // namespace sapipe::cuda
