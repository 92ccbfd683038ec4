// A plain scalar implementation of ALGORITHMS.md sections 1-4, in double, written from the
// formulas rather than from the kernels: what the CPU kernels are checked against.
#pragma once

#include <cstddef>

#include "sapipe/kernels.h"

namespace sapipe::tests {

// The step over elements [buffers.offset, + count) with the same buffer roles as sapipe_cpu_update;
// returns false (writing nothing) when a read gradient is NaN/Inf.
bool reference_update(const sapipe_update_config& c, const sapipe_update_buffers& b);

}  // namespace sapipe::tests
