// Run-time choice of the instruction set the CPU kernels use. One binary is built for the
// portable x86-64 baseline; kernels are also compiled for AVX2 (x86-64-v3) and AVX-512
// (x86-64-v4) and the best one the CPU supports is picked at first use. SAPIPE_SIMD=baseline|avx2|
// avx512 forces a lower level (for testing every path on one machine); a level the CPU lacks is
// never chosen.
#pragma once

// The target attributes a kernel wrapper is compiled with for each level (kernel_table.cpp,
// nn_elementwise.cpp): the library itself is built for the portable baseline.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SAPIPE_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))
#define SAPIPE_TARGET_AVX512 __attribute__((target("arch=x86-64-v4,prefer-vector-width=512")))
#else
#define SAPIPE_TARGET_AVX2
#define SAPIPE_TARGET_AVX512
#endif

namespace sapipe::cpu {

enum class SimdLevel { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

SimdLevel best_supported_simd();
SimdLevel active_simd();  // best supported, lowered by SAPIPE_SIMD
const char* simd_name(SimdLevel level);

}  // namespace sapipe::cpu
