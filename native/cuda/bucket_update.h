// The fused all-reduce + update of one parameter set on the GPU, in two forms.
//
// Replicated: each bucket's gradient is all-reduced with NCCL on a communication stream, and an
// event recorded after it lets that bucket's fused update start on the compute stream while later
// buckets are still in communication.
//
// Sharded (ZeRO-1): one reduce-scatter leaves rank r the reduced part r of the gradient; r updates
// only that part of the weights and optimizer state, then all-gathers of the weights (and the
// predicted weights) give every rank every part. The state stays current on the own part only.
//
// The guard stays all or nothing across buckets and ranks, with no host round trip: before any
// reduction every rank counts the non-finite elements of its own gradients (in the staleness-1
// scheme they are complete when the step's all-reduce starts) and takes their squared norm; one
// all-reduce of two floats tells every rank whether any input is non-finite, or large enough that
// a sum of `size` of them could overflow (|g| <= sqrt(norm) < FLT_MAX / 2 size rules it out). Every
// update reads the resulting flag and skips when it is set, so either every bucket of every rank is
// updated or none is, and a reduced value can never be non-finite when the update runs. A step
// skipped for the overflow risk alone is finished by enqueue_update_recheck, which checks the
// reduced gradient itself (already there: no second reduction).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../core/device/nccl_loader.h"
#include "sapipe/kernels.h"
#include "sapipe/plugin.h"

namespace sapipe::cuda {

struct FusedStepRun {
  const nccl::Api* nccl;
  nccl::Comm comm;
  int rank;
  int size;
  cudaStream_t comm_stream;
  cudaStream_t compute_stream;
  // One event per bucket (at least one), created by the caller with cudaEventDisableTiming.
  cudaEvent_t* reduced;
  // Recorded on the compute stream after the sharded update, for the all-gathers to wait on.
  cudaEvent_t updated;
  // kFusedStepScratchBytes of device memory, owned by the caller.
  void* scratch;
};

// Bytes of device scratch the fused steps need.
constexpr size_t kFusedStepScratchBytes = 64;

// buffers: the whole set; bucket_counts: consecutive ranges from buffers.offset, summing to
// buffers.count. config.grad_scale should fold in 1/size. Enqueues everything and returns.
sapipe_status enqueue_bucketed_update(const FusedStepRun& run, const sapipe_update_config& config,
                                      const sapipe_update_buffers& buffers, const size_t* bucket_counts,
                                      size_t num_buckets);

// As enqueue_bucketed_update, with bucket i's reduction waiting on comm_stream for ready[i] (its
// gradient enqueued by a backward pass on another stream), the buckets reduced from the last to the
// first, and the guard's counts taken per bucket before its reduction (the guard and every update
// follow the last reduction). The same sums and updates as enqueue_bucketed_update (the squared
// norm behind the overflow-risk test is summed per bucket).
sapipe_status enqueue_bucketed_update_after(const FusedStepRun& run, const sapipe_update_config& config,
                                            const sapipe_update_buffers& buffers, const size_t* bucket_counts,
                                            const cudaEvent_t* ready, size_t num_buckets);

// buffers.count must be a multiple of run.size; the set must not read a local gradient.
sapipe_status enqueue_sharded_update(const FusedStepRun& run, const sapipe_update_config& config,
                                     const sapipe_update_buffers& buffers);

// After a step skipped for the overflow risk only: the reduced gradient (the own part when sharded)
// is checked, the check all-reduced, and the update (and all-gathers) run unless it found any.
sapipe_status enqueue_update_recheck(const FusedStepRun& run, const sapipe_update_config& config,
                                     const sapipe_update_buffers& buffers, bool sharded);

// The outcome of the last step or recheck; call once both streams are idle.
sapipe_status read_fused_step_result(const FusedStepRun& run, bool after_recheck, sapipe_nccl_step_result* out);

}  // namespace sapipe::cuda
