// What every host communication backend's collectives are made of: the kinds, numbered as the
// TypeScript side numbers them (lib/comm/native-handle.ts), their arguments, and the sharded fused
// step's job. local (local/local_group.h) and ucx (the addon's UCX binding, the ring and direct
// algorithms) use the same vocabulary.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../core/update_plan.h"
#include "sapipe/kernels.h"

namespace sapipe::comm {

enum class CollectiveKind : int32_t {
  kBarrier = 0,
  kAllreduce = 1,            // in place on input
  kReduceScatter = 2,        // output (count m) = scale * sum of the inputs' part `rank` (count n*m)
  kAllgather = 3,            // output (count n*m) = concatenation of the inputs (count m)
  kBroadcast = 4,            // in place on input, from root
  kReduceScatterInPlace = 5, // input's part partition(count, n, rank) = scale * sum; other parts untouched
  kAllgatherInPlace = 6,     // every rank's part partition(count, n, rank) of input copied to all ranks
  kReduceUpdate = 7,         // the sharded fused step: see ReduceUpdateJob
  kUpdateFromParts = 8,      // the replicated fused step's second pass: see ReduceUpdateJob
};

// The sharded mode's fused step in one pass (kReduceUpdate). The input is each rank's local
// gradient over [offset, offset + count) of its ParamSet. Rank r owns part partition(count, n, r);
// for each cache-sized block of it, it averages the block over every rank's gradient into an L1
// scratch block, runs the fused optimizer kernel on its own weights and state there, and copies
// the updated weights (and predicted weights) of the block into every peer's buffers. Each
// gradient byte is read once, nothing reduced is written back, and the optimizer state of part r
// is read and written by rank r only: state is sharded (valid on the owner's part), weights and
// predicted weights end up identical on every rank.
//
// The replicated mode's fused step in two passes (local backend): kReduceScatterInPlace leaves
// rank q's part of the averaged gradient in rank q's own gradient buffer and counts the
// non-finite sums, so the step can be skipped on every rank before anything is written; then
// kUpdateFromParts: every rank updates its whole range of weights and state, reading part q of the
// averaged gradient where rank q left it. Against an all-reduce then an update, nothing reduced is
// copied to the other ranks' buffers and read back: every rank's state stays whole (replicated),
// and each rank's gradient buffer keeps its own part averaged and the rest as it was.
struct ReduceUpdateJob {
  core::UpdatePlan plan{};
  sapipe_update_config config{};
  // This rank's buffers; offset/count as in the collective's input range. kReduceUpdate does not
  // read grad (the reduced block is used instead); kUpdateFromParts reads every rank's gradient,
  // which is the collective's input. Out-of-place weights (weights_in) are refused for both.
  // the collective's input range.
  sapipe_update_buffers buffers{};
};

struct CollectiveArgs {
  CollectiveKind kind = CollectiveKind::kBarrier;
  float* input = nullptr;
  size_t input_count = 0;
  float* output = nullptr;
  size_t output_count = 0;
  float scale = 1.0f;
  int32_t root = 0;
  const ReduceUpdateJob* job = nullptr;  // kReduceUpdate and kUpdateFromParts; owned by the caller for the call
};

}  // namespace sapipe::comm
