// Checks of what the addon queues, run without Node: the execution queue's order and failure
// chaining, the latches between queues, the queued host update (gate, clip, latch) and the guard
// verdict, and the threads' own kernel pools and the queue carrying them (native/core/execution_queue.h,
// latch.h, queued_update.h, thread_pool.h).
#pragma once

#include "check.h"

namespace sapipe::tests {

void check_execution_queue(Checks& t);
void check_latches(Checks& t);
void check_queued_update(Checks& t);
void check_thread_pools(Checks& t);

}  // namespace sapipe::tests
