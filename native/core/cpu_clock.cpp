#include "cpu_clock.h"

#include <algorithm>
#include <chrono>

namespace sapipe {

double measure_cpu_clock_ghz() {
  double ghz = 0.0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  constexpr long kIterations = 1 << 21;  // 4 multiplies each
  for (int rep = 0; rep < 3; ++rep) {
    unsigned long x = 3;
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < kIterations; ++i)
      __asm__ volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > 0) ghz = std::max(ghz, 12.0 * kIterations / seconds / 1e9);
  }
#endif
  return ghz;
}

}  // namespace sapipe
