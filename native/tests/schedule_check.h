// Checks of what the addon queues, run without Node: the execution queue's order and failure
// chaining, the latches between queues, the queued host update (gate, clip, latch) and the guard
// verdict (native/core/execution_queue.h, latch.h, queued_update.h).
#pragma once

#include "check.h"

namespace sapipe::tests {

void check_execution_queue(Checks& t);
void check_latches(Checks& t);
void check_queued_update(Checks& t);

}  // namespace sapipe::tests
