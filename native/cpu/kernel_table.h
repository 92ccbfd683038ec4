// One function pointer per kernel (the table core/host_kernels.h declares), filled with the variant
// compiled for an instruction set (simd.h). Each entry processes one contiguous range on the
// calling thread; cpu_api.cpp splits work across the thread pool.
#pragma once

#include <cstddef>
#include <cstdint>

#include "simd.h"
#include "../core/host_kernels.h"

namespace sapipe::cpu {

using KernelTable = core::HostKernels;

const KernelTable& kernel_table(SimdLevel level);
inline const KernelTable& active_kernels() { return kernel_table(active_simd()); }

}  // namespace sapipe::cpu
