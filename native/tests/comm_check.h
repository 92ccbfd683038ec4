// Checks of the local backend's operations, run without Node: ranks as threads of this process
// running collectives by the group or by the ring, point-to-point messages, and the fused steps'
// job (native/comm/local/local_ops.h).
#pragma once

#include "check.h"

namespace sapipe::tests {

void check_local_ops(Checks& t);

}  // namespace sapipe::tests
