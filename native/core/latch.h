// Latches between two execution queues: a bucket's update waits on the optimizer's queue until the
// signal queued behind that bucket's reduction on the communicator's queue has run. A latch is a
// slot of a float array (the memory of a NativeBuffer): 0 until signalled, 1 signalled, -1 when
// the signal was dropped unrun (its queue shut down) or ran behind a failed operation. One mutex
// for every latch, which also orders the signalling thread's earlier writes (the reduced bucket,
// the verdict) before the waiting update's reads.
#pragma once

#include <chrono>
#include <cstddef>

#include "sapipe/status.h"

namespace sapipe::core {

using LatchClock = std::chrono::steady_clock;

// Waits for latch[slot]: SAPIPE_OK once signalled, SAPIPE_ERR_DISPOSED when the signal was
// dropped unrun or ran behind a failure, SAPIPE_ERR_TIMEOUT when the deadline passed first.
sapipe_status wait_for_latch(const float* latch, size_t slot, LatchClock::time_point deadline);

// The signal, run on its queue behind the operation it vouches for: sets latch[slot] to 1 and
// wakes the waiters. Sets -1 instead (the waiters fail, writing nothing) when that operation
// failed (previous_failed) or latch[slot - 1] is -1: a chain of signals on one queue is released
// only while everything before each succeeded.
void signal_latch(float* latch, size_t slot, bool previous_failed);

// The signal dropped unrun (its queue shut down, as when a worker is terminated): sets
// latch[slot] to -1, so the waiters fail at once instead of sitting out their deadline.
void drop_latch_signal(float* latch, size_t slot);

}  // namespace sapipe::core
