// Every kernel variant run side by side with the scalar reference (scalar_reference.h): the one
// comparison loop of the harnesses that check an implementation of the fused update (the CPU
// kernels in cpu_check, the CUDA element maths in cuda_math_check).
#pragma once

#include <cstddef>
#include <functional>

#include "check.h"
#include "sapipe/kernels.h"
#include "variants.h"

namespace sapipe::tests {

// Applies one step of `config` to elements [offset, offset + count) of `state`; returns whether
// it was applied.
using UpdateUnderTest = std::function<bool(const sapipe_update_config& config, HostState& state, size_t offset, size_t count)>;

// For every variant, sizes with vector tails and odd offsets, `steps` steps: every output buffer
// within rtol 2e-5, atol 1e-6 of the reference (which writes nothing outside the range either).
void check_variants_against_reference(Checks& t, const UpdateUnderTest& update, int steps);

}  // namespace sapipe::tests
