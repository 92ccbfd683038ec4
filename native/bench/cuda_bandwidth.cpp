// Needs a GPU: the effective bandwidth of every fused update variant (bytes as ALGORITHMS.md
// counts them / median time) and its ratio to a device-to-device copy timed in the same run,
// interleaved. The target (docs/cuda.md) is >= 0.9 of the copy at 64M elements.
// usage: sapipe_cuda_bench [elements=64M] [reps=20] [device=0]
#include <cstdio>
#include <cstdlib>

#include "../tests/device_plugin.h"
#include "../tests/variants.h"

using namespace sapipe;
using namespace sapipe::tests;

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{64} << 20;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  const int device = argc > 3 ? std::atoi(argv[3]) : 0;
  const sapipe_cuda_plugin_v1* cuda = open_cuda(device);
  if (cuda == nullptr) return 2;
  std::printf("%zu fp32 elements, median of %d runs after 3 warm-up; copy = cudaMemcpy D2D (8 B/element)\n", n, reps);
  std::printf("%-40s %6s %10s %9s %8s %10s %8s\n", "variant", "B/elem", "ms", "GB/s", "x copy", "guard ms", "x copy");
  double lowest = 1e9;
  for (const Variant& v : update_variants()) {
    sapipe_cuda_bench_result r{};
    if (cuda->bench_update(&v.config, n, reps, 3, &r) != SAPIPE_OK) {
      std::printf("%s: %s\n", v.name.c_str(), cuda->last_error());
      return 1;
    }
    const double bytes = static_cast<double>(r.bytes_per_element) * static_cast<double>(n);
    const double copy_gbps = 8.0 * static_cast<double>(n) / (r.copy_ms * 1e6);
    const double gbps = bytes / (r.update_ms * 1e6), guarded_gbps = bytes / (r.guarded_ms * 1e6);
    std::printf("%-40s %6d %10.3f %9.1f %8.3f %10.3f %8.3f\n", v.name.c_str(), r.bytes_per_element, r.update_ms, gbps,
                gbps / copy_gbps, r.guarded_ms, guarded_gbps / copy_gbps);
    if (gbps / copy_gbps < lowest) lowest = gbps / copy_gbps;
  }
  std::printf("lowest ratio to the device copy (fused kernel alone): %.3f\n", lowest);
  return 0;
}
