// Checks of the communication backends' operations, run without Node: the local backend's ranks
// as threads of this process running collectives by the group or by the ring, point-to-point
// messages, and the fused steps' job (native/comm/local/local_ops.h); the NCCL backend's
// operations over the CUDA plugin that emulates a device in host memory, one rank and two ranks
// as threads (native/comm/nccl/nccl_ops.h, native/tests/fakes/plugin_host_memory.cpp).
#pragma once

#include <string>

#include "check.h"

namespace sapipe::tests {

void check_local_ops(Checks& t);
// fakes: the folder of the test plugins CMake builds beside the harness.
void check_nccl_ops(Checks& t, const std::string& fakes);

}  // namespace sapipe::tests
