// The fused all-reduce of one parameter set on the GPU: each bucket's gradient is all-reduced
// with NCCL on a communication stream, and an event recorded after it lets that bucket's fused
// update start on the compute stream while later buckets are still in communication.
//
// The non-finite guard stays all or nothing across buckets: before the first bucket, every rank
// counts the non-finite elements of its own gradients (all buckets: in the staleness-1 scheme
// they are complete when the all-reduce of the step starts) and that count is all-reduced as one
// float. Every bucket's update reads it and skips when it is non-zero, so either every bucket
// of every rank is updated or none is. A sum of finite values that overflows is counted after
// each bucket's all-reduce into overflow_count, for the caller to report after the step.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "nccl_loader.h"
#include "sapipe/kernels.h"

namespace sapipe::cuda {

struct BucketedUpdate {
  const nccl::Api* nccl;
  nccl::Comm comm;
  cudaStream_t comm_stream;
  cudaStream_t compute_stream;
  // One event per bucket (created by the caller with cudaEventDisableTiming).
  cudaEvent_t* reduced;
  // Device scratch: [0] the all-reduced local non-finite count as a float (the guard),
  // [1] its int64 staging word, [2] the overflow count.
  void* scratch;
};

// buffers[i] describes bucket i (its offset and count inside the set's buffers); config.grad_scale
// should fold in 1/world_size. Enqueues everything and returns without waiting.
sapipe_status enqueue_bucketed_update(const BucketedUpdate& run, const sapipe_update_config& config,
                                      const sapipe_update_buffers* buffers, size_t num_buckets);

// Bytes of device scratch enqueue_bucketed_update needs.
constexpr size_t kBucketedUpdateScratchBytes = 64;

}  // namespace sapipe::cuda
