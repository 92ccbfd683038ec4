// The NCCL backend's operations, without Node: what each operation queued on a rank's
// communicator (nccl_watchdog.h's NcclState) does on the queue's thread. Each enqueues its NCCL
// calls through the CUDA plugin's table on the communicator's streams, then waits for them with
// the watchdog, which aborts the communicator instead of hanging when a peer dies.
// native/addon/device/comm_nccl_binding.cpp is its JS face: it converts arguments, holds the device
// memory and settles the Promises.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "nccl_watchdog.h"
#include "sapipe/kernels.h"
#include "sapipe/plugin.h"

namespace sapipe::comm::nccl {

// An operation's deadline, from when it starts running: the communicator's timeout.
Clock::time_point operation_deadline(const NcclState& st);

// After every operation: destroy() while it was queued or running left the abort to this thread.
void finish_operation(NcclState& st);

// destroy(): aborts now when no operation is in flight; otherwise the operation in flight aborts
// it (and fails with ERR_DISPOSED). Idempotent.
void request_destroy(NcclState& st);

// Creates the streams and the count word on the communicator's device, then the communicator.
// Blocks until every rank has joined: the caller made sure they are all alive (a store barrier
// just before), as NCCL's blocking init cannot be given a deadline.
Outcome init_communicator(NcclState& st, const uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES]);

// The collectives, numbered as lib/backends/cuda.ts numbers them (NcclCollective).
enum NcclKind : int32_t { kNcclAllReduce = 0, kNcclReduceScatter = 1, kNcclAllGather = 2, kNcclBroadcast = 3, kNcclSend = 4, kNcclRecv = 5 };

struct NcclCollective {
  int32_t kind = kNcclAllReduce;
  float* a = nullptr;  // the data (in place), or the input of reduceScatter and allgather
  float* b = nullptr;  // the output of reduceScatter and allgather
  size_t count = 0;    // a's elements, but reduceScatter's b's (a holds size x count) and allgather's a's
  int32_t arg = 0;     // op, root or peer
};

// Runs a collective on the communicator's stream and waits for it. Reductions set *non_finite to
// the non-finite count of their result (as the host backends do, which count while reducing;
// NCCL does not count, so a count kernel follows on the same stream); other kinds leave it.
Outcome run_collective(NcclState& st, const NcclCollective& c, Clock::time_point deadline, int64_t* non_finite);

// The bucketed fused step on the GPU (or, recheck, its exact second look after an overflow risk),
// over both streams, and its outcome.
struct FusedStep {
  sapipe_update_config config{};
  sapipe_update_buffers buffers{};
  std::vector<size_t> buckets;
  bool sharded = false;
  bool recheck = false;
  // Replicated, not a recheck: one event per bucket, recorded once a backward pass (on another
  // stream) enqueued that bucket's gradient; each bucket's reduction then waits for its event on
  // the GPU (the plugin's nccl_fused_update_after, which the caller checked the table has). Empty:
  // the gradient is complete already.
  std::vector<void*> ready;
};
Outcome run_fused_step(NcclState& st, const FusedStep& step, Clock::time_point deadline, sapipe_nccl_step_result* result);

// A copy of count floats between host memory and device memory on the compute stream, in order
// with the communicator's other operations (the staleness-1 trainer stages its gradient in and the
// new weights out around the fused step), waited for.
Outcome stage_copy(NcclState& st, float* device, float* host, size_t count, bool to_device, Clock::time_point deadline);

}  // namespace sapipe::comm::nccl
