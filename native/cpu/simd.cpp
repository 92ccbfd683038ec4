#include "simd.h"

#include <cstdlib>
#include <cstring>

namespace sapipe::cpu {

SimdLevel best_supported_simd() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return SimdLevel::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
    return SimdLevel::kAvx2;
#endif
  return SimdLevel::kBaseline;
}

SimdLevel active_simd() {
  static const SimdLevel level = [] {
    SimdLevel best = best_supported_simd();
    const char* env = std::getenv("SAPIPE_SIMD");
    if (env == nullptr) return best;
    SimdLevel wanted = best;
    if (std::strcmp(env, "baseline") == 0) wanted = SimdLevel::kBaseline;
    else if (std::strcmp(env, "avx2") == 0) wanted = SimdLevel::kAvx2;
    else if (std::strcmp(env, "avx512") == 0) wanted = SimdLevel::kAvx512;
    return static_cast<int>(wanted) < static_cast<int>(best) ? wanted : best;
  }();
  return level;
}

const char* simd_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kBaseline: return "baseline";
  }
  return "baseline";
}

}  // namespace sapipe::cpu
