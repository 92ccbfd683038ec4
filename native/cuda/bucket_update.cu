#include "bucket_update.h"

#include <cfloat>
#include <cstring>
#include <string>

#include "../core/update_plan.h"
#include "device_errors.h"
#include "fused_update.cuh"
#include "launch.cuh"
#include "reduce.cuh"

namespace sapipe::cuda {
namespace {

// The scratch words (8 bytes each).
struct Scratch {
  float* guard;           // [0]: {non-finite inputs, ranks whose sum could overflow}, all-reduced
  int64_t* local_bad;     // [1]: this rank's non-finite inputs
  double* norm;           // [2]: this rank's squared gradient norm
  int64_t* flag;          // [3]: the step's skip flag, read by every update kernel
  int64_t* recheck_bad;   // [4]: this rank's non-finite reduced values (recheck)
  float* recheck_global;  // [5]: their all-reduced count
  int64_t* recheck_flag;  // [6]: the recheck's skip flag
  double* bucket_norm;    // [7]: one bucket's squared norm, before it is added to [2]
};

Scratch scratch_of(void* base) {
  auto* w = static_cast<int64_t*>(base);
  return {reinterpret_cast<float*>(w + 0), w + 1, reinterpret_cast<double*>(w + 2), w + 3,
          w + 4, reinterpret_cast<float*>(w + 5), w + 6, reinterpret_cast<double*>(w + 7)};
}

__global__ void guard_words_kernel(const int64_t* local_bad, const double* norm, float size, float* guard) {
  guard[0] = static_cast<float>(*local_bad);
  // sqrt(norm) bounds every |g|; a non-finite norm from finite inputs is itself an overflow risk.
  const double bound = sqrt(*norm) * static_cast<double>(size);
  guard[1] = (*local_bad == 0 && !(bound < static_cast<double>(FLT_MAX) / 2)) ? 1.0f : 0.0f;
}
__global__ void add_norm_kernel(const double* part, double* total) { *total += *part; }
__global__ void guard_flag_kernel(const float* guard, int64_t* flag) { *flag = (guard[0] != 0.0f || guard[1] != 0.0f) ? 1 : 0; }
__global__ void count_to_float_kernel(const int64_t* count, float* out) { *out = static_cast<float>(*count); }
__global__ void float_to_flag_kernel(const float* global, int64_t* flag) { *flag = *global != 0.0f ? 1 : 0; }

sapipe_status from_nccl(const nccl::Api& api, nccl::Result r, const char* what) {
  if (r == nccl::kSuccess || r == nccl::kInProgress) return SAPIPE_OK;
  return fail(SAPIPE_ERR_INTERNAL, std::string(what) + ": " + (api.GetErrorString ? api.GetErrorString(r) : "NCCL error"));
}

#define SAPIPE_TRY(expr)                      \
  do {                                        \
    if (sapipe_status s_ = (expr); s_ != SAPIPE_OK) return s_; \
  } while (0)

// From this rank's count and squared norm: the two guard floats, all-reduced, and the skip flag.
sapipe_status enqueue_guard_words(const FusedStepRun& run, const Scratch& s) {
  cudaStream_t cs = run.comm_stream;
  guard_words_kernel<<<1, 1, 0, cs>>>(s.local_bad, s.norm, static_cast<float>(run.size), s.guard);
  SAPIPE_TRY(from_nccl(*run.nccl, run.nccl->AllReduce(s.guard, s.guard, 2, nccl::kFloat32, nccl::kSum, run.comm, cs),
                       "ncclAllReduce (guard)"));
  guard_flag_kernel<<<1, 1, 0, cs>>>(s.guard, s.flag);
  return check_launch("fused step guard");
}

// Clears the scratch, counts and measures this rank's inputs, all-reduces the two guard floats and
// derives the skip flag, all on the communication stream.
sapipe_status enqueue_guard(const FusedStepRun& run, const sapipe_update_config& config, const sapipe_update_buffers& b) {
  const Scratch s = scratch_of(run.scratch);
  cudaStream_t cs = run.comm_stream;
  SAPIPE_TRY(from_cuda(cudaMemsetAsync(run.scratch, 0, kFusedStepScratchBytes, cs), "fused step: clear scratch"));
  enqueue_count_non_finite(b.grad + b.offset, b.count, s.local_bad, cs);
  if (core::update_reads_local_grad(config)) enqueue_count_non_finite(b.local_grad + b.offset, b.count, s.local_bad, cs);
  SAPIPE_TRY(enqueue_squared_norm(b.grad + b.offset, b.count, s.norm, cs));
  return enqueue_guard_words(run, s);
}

sapipe_update_buffers part_of(const sapipe_update_buffers& b, size_t offset, size_t count) {
  sapipe_update_buffers p = b;
  p.offset = offset;
  p.count = count;
  return p;
}

// The all-gathers in place of the sharded step: every rank's part of the weights (and predicted
// weights) to every rank, after this rank's update of its part.
sapipe_status enqueue_gather_parts(const FusedStepRun& run, const sapipe_update_buffers& b) {
  const size_t part = b.count / static_cast<size_t>(run.size);
  const size_t own = b.offset + static_cast<size_t>(run.rank) * part;
  SAPIPE_TRY(from_cuda(cudaEventRecord(run.updated, run.compute_stream), "cudaEventRecord"));
  SAPIPE_TRY(from_cuda(cudaStreamWaitEvent(run.comm_stream, run.updated, 0), "cudaStreamWaitEvent"));
  const nccl::Api& api = *run.nccl;
  SAPIPE_TRY(from_nccl(api, api.AllGather(b.weights + own, b.weights + b.offset, part, nccl::kFloat32, run.comm, run.comm_stream),
                       "ncclAllGather (weights)"));
  if (b.predicted != nullptr)
    SAPIPE_TRY(from_nccl(api,
                         api.AllGather(b.predicted + own, b.predicted + b.offset, part, nccl::kFloat32, run.comm, run.comm_stream),
                         "ncclAllGather (predicted weights)"));
  return SAPIPE_OK;
}

}  // namespace

sapipe_status enqueue_bucketed_update(const FusedStepRun& run, const sapipe_update_config& config,
                                      const sapipe_update_buffers& buffers, const size_t* bucket_counts,
                                      size_t num_buckets) {
  if (run.nccl == nullptr || run.comm == nullptr || run.reduced == nullptr || run.scratch == nullptr ||
      bucket_counts == nullptr || num_buckets == 0)
    return fail(SAPIPE_ERR_INVALID_ARGUMENT, "bucketed update: missing communicator, events, scratch or buckets");
  const Scratch s = scratch_of(run.scratch);
  const nccl::Api& api = *run.nccl;
  cudaStream_t cs = run.comm_stream;
  SAPIPE_TRY(enqueue_guard(run, config, buffers));
  // Per bucket: all-reduce in place, then the bucket's event.
  size_t at = buffers.offset;
  for (size_t i = 0; i < num_buckets; ++i) {
    float* grad = const_cast<float*>(buffers.grad) + at;
    SAPIPE_TRY(from_nccl(api, api.AllReduce(grad, grad, bucket_counts[i], nccl::kFloat32, nccl::kSum, run.comm, cs),
                         "ncclAllReduce (bucket)"));
    SAPIPE_TRY(from_cuda(cudaEventRecord(run.reduced[i], cs), "cudaEventRecord"));
    at += bucket_counts[i];
  }
  // Each bucket's update waits for its own all-reduce only; all read the one flag, which the first
  // event already covers.
  sapipe_update_config c = config;
  c.grad_checked = 1;  // the guard is the all-reduced flag, not a scan of this bucket
  at = buffers.offset;
  for (size_t i = 0; i < num_buckets; ++i) {
    SAPIPE_TRY(from_cuda(cudaStreamWaitEvent(run.compute_stream, run.reduced[i], 0), "cudaStreamWaitEvent"));
    SAPIPE_TRY(enqueue_fused_update_guarded_by(c, part_of(buffers, at, bucket_counts[i]), nullptr, s.flag, run.compute_stream));
    at += bucket_counts[i];
  }
  return check_launch("bucketed update");
}

sapipe_status enqueue_bucketed_update_after(const FusedStepRun& run, const sapipe_update_config& config,
                                            const sapipe_update_buffers& buffers, const size_t* bucket_counts,
                                            const cudaEvent_t* ready, size_t num_buckets) {
  if (run.nccl == nullptr || run.comm == nullptr || run.reduced == nullptr || run.scratch == nullptr ||
      bucket_counts == nullptr || ready == nullptr || num_buckets == 0)
    return fail(SAPIPE_ERR_INVALID_ARGUMENT, "bucketed update after events: missing communicator, events, scratch or buckets");
  const Scratch s = scratch_of(run.scratch);
  const nccl::Api& api = *run.nccl;
  cudaStream_t cs = run.comm_stream;
  const bool local = core::update_reads_local_grad(config);
  SAPIPE_TRY(from_cuda(cudaMemsetAsync(run.scratch, 0, kFusedStepScratchBytes, cs), "fused step: clear scratch"));
  // From the last bucket to the first, as the backward pass completes them. Each bucket's inputs
  // are counted and measured before its reduction overwrites them; the guard decides once all are
  // in, so no update can start before the last reduction (all or nothing needs every count).
  size_t end = buffers.offset + buffers.count;
  for (size_t k = num_buckets; k-- > 0;) {
    const size_t at = end - bucket_counts[k];
    SAPIPE_TRY(from_cuda(cudaStreamWaitEvent(cs, ready[k], 0), "cudaStreamWaitEvent (bucket ready)"));
    enqueue_count_non_finite(buffers.grad + at, bucket_counts[k], s.local_bad, cs);
    if (local) enqueue_count_non_finite(buffers.local_grad + at, bucket_counts[k], s.local_bad, cs);
    SAPIPE_TRY(enqueue_squared_norm(buffers.grad + at, bucket_counts[k], s.bucket_norm, cs));
    add_norm_kernel<<<1, 1, 0, cs>>>(s.bucket_norm, s.norm);
    float* grad = const_cast<float*>(buffers.grad) + at;
    SAPIPE_TRY(from_nccl(api, api.AllReduce(grad, grad, bucket_counts[k], nccl::kFloat32, nccl::kSum, run.comm, cs),
                         "ncclAllReduce (bucket)"));
    end = at;
  }
  SAPIPE_TRY(enqueue_guard_words(run, s));
  SAPIPE_TRY(from_cuda(cudaEventRecord(run.reduced[0], cs), "cudaEventRecord"));
  SAPIPE_TRY(from_cuda(cudaStreamWaitEvent(run.compute_stream, run.reduced[0], 0), "cudaStreamWaitEvent"));
  // The update is elementwise: one launch over the whole set computes what one per bucket would.
  sapipe_update_config c = config;
  c.grad_checked = 1;
  SAPIPE_TRY(enqueue_fused_update_guarded_by(c, buffers, nullptr, s.flag, run.compute_stream));
  return check_launch("bucketed update after events");
}

sapipe_status enqueue_sharded_update(const FusedStepRun& run, const sapipe_update_config& config,
                                     const sapipe_update_buffers& buffers) {
  if (run.nccl == nullptr || run.comm == nullptr || run.reduced == nullptr || run.updated == nullptr || run.scratch == nullptr)
    return fail(SAPIPE_ERR_INVALID_ARGUMENT, "sharded update: missing communicator, events or scratch");
  if (run.size < 1 || buffers.count % static_cast<size_t>(run.size) != 0)
    return fail(SAPIPE_ERR_SIZE_MISMATCH, "sharded update: the element count must be a multiple of the world size");
  if (core::update_reads_local_grad(config))
    return fail(SAPIPE_ERR_INVALID_ARGUMENT,
                "sharded update: the 'local' estimates read each rank's own gradient over the whole set; use 'prev-sync'");
  const Scratch s = scratch_of(run.scratch);
  const nccl::Api& api = *run.nccl;
  const size_t part = buffers.count / static_cast<size_t>(run.size);
  const size_t own = buffers.offset + static_cast<size_t>(run.rank) * part;
  float* grad = const_cast<float*>(buffers.grad);
  SAPIPE_TRY(enqueue_guard(run, config, buffers));
  SAPIPE_TRY(from_nccl(api,
                       api.ReduceScatter(grad + buffers.offset, grad + own, part, nccl::kFloat32, nccl::kSum, run.comm,
                                         run.comm_stream),
                       "ncclReduceScatter"));
  SAPIPE_TRY(from_cuda(cudaEventRecord(run.reduced[0], run.comm_stream), "cudaEventRecord"));
  SAPIPE_TRY(from_cuda(cudaStreamWaitEvent(run.compute_stream, run.reduced[0], 0), "cudaStreamWaitEvent"));
  sapipe_update_config c = config;
  c.grad_checked = 1;
  SAPIPE_TRY(enqueue_fused_update_guarded_by(c, part_of(buffers, own, part), nullptr, s.flag, run.compute_stream));
  // Skipped or not, the all-gathers run: every rank issues the same collectives, and a skipped
  // step gathers the unchanged parts.
  SAPIPE_TRY(enqueue_gather_parts(run, buffers));
  return check_launch("sharded update");
}

sapipe_status enqueue_update_recheck(const FusedStepRun& run, const sapipe_update_config& config,
                                     const sapipe_update_buffers& buffers, bool sharded) {
  if (run.nccl == nullptr || run.comm == nullptr || run.reduced == nullptr || run.updated == nullptr || run.scratch == nullptr)
    return fail(SAPIPE_ERR_INVALID_ARGUMENT, "update recheck: missing communicator, events or scratch");
  if (sharded && (run.size < 1 || buffers.count % static_cast<size_t>(run.size) != 0))
    return fail(SAPIPE_ERR_SIZE_MISMATCH, "update recheck: the element count must be a multiple of the world size");
  const Scratch s = scratch_of(run.scratch);
  cudaStream_t cs = run.comm_stream;
  const size_t part = sharded ? buffers.count / static_cast<size_t>(run.size) : buffers.count;
  const size_t own = sharded ? buffers.offset + static_cast<size_t>(run.rank) * part : buffers.offset;
  SAPIPE_TRY(from_cuda(cudaMemsetAsync(s.recheck_bad, 0, 3 * sizeof(int64_t), cs), "update recheck: clear"));
  enqueue_count_non_finite(buffers.grad + own, part, s.recheck_bad, cs);
  count_to_float_kernel<<<1, 1, 0, cs>>>(s.recheck_bad, s.recheck_global);
  // Replicated, every rank holds the same reduced gradient and count: no collective needed.
  if (sharded)
    SAPIPE_TRY(from_nccl(*run.nccl,
                         run.nccl->AllReduce(s.recheck_global, s.recheck_global, 1, nccl::kFloat32, nccl::kSum, run.comm, cs),
                         "ncclAllReduce (recheck)"));
  float_to_flag_kernel<<<1, 1, 0, cs>>>(s.recheck_global, s.recheck_flag);
  SAPIPE_TRY(from_cuda(cudaEventRecord(run.reduced[0], cs), "cudaEventRecord"));
  SAPIPE_TRY(from_cuda(cudaStreamWaitEvent(run.compute_stream, run.reduced[0], 0), "cudaStreamWaitEvent"));
  sapipe_update_config c = config;
  c.grad_checked = 1;
  SAPIPE_TRY(enqueue_fused_update_guarded_by(c, part_of(buffers, own, part), nullptr, s.recheck_flag, run.compute_stream));
  if (sharded) SAPIPE_TRY(enqueue_gather_parts(run, buffers));
  return check_launch("update recheck");
}

sapipe_status read_fused_step_result(const FusedStepRun& run, bool after_recheck, sapipe_nccl_step_result* out) {
  if (run.scratch == nullptr || out == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "fused step result: null argument");
  int64_t words[kFusedStepScratchBytes / sizeof(int64_t)] = {};
  SAPIPE_TRY(from_cuda(cudaMemcpy(words, run.scratch, sizeof words, cudaMemcpyDeviceToHost), "fused step result"));
  float guard[2], recheck;
  static_assert(sizeof guard == sizeof(int64_t), "two floats in one word");
  std::memcpy(guard, &words[0], sizeof guard);
  std::memcpy(&recheck, &words[5], sizeof recheck);
  if (after_recheck) {
    out->non_finite_count = static_cast<int64_t>(recheck);
    out->overflow_risk = 0;
    out->applied = recheck == 0.0f ? 1 : 0;
  } else {
    out->non_finite_count = static_cast<int64_t>(guard[0]);
    out->overflow_risk = guard[0] == 0.0f && guard[1] != 0.0f ? 1 : 0;
    out->applied = guard[0] == 0.0f && guard[1] == 0.0f ? 1 : 0;
  }
  return SAPIPE_OK;
}

}  // namespace sapipe::cuda
