// Needs a GPU: the effective bandwidth of every fused update variant (bytes as ALGORITHMS.md
// counts them / median time) and its ratio to a device-to-device copy timed in the same run,
// interleaved. The target (docs/cuda.md) is >= 0.9 of the copy at 64M elements. Then MSTopK's
// selection (with the residual) on the GPU against the CPU's and the exact top-k on the host, on
// the same Gaussian data (0 for topk-elements skips it).
// usage: sapipe_cuda_bench [elements=64M] [reps=20] [device=0] [topk-elements=16M]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "sapipe/kernels.h"

#include "../tests/device_plugin.h"
#include "../tests/variants.h"

using namespace sapipe;
using namespace sapipe::tests;

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double time_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Median wall time of each selection (both return once the selection is written), the residual
// restored between runs outside the timing.
int bench_topk(const sapipe_cuda_plugin_v1* cuda, size_t n, int reps) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n), r0(n), r(n), x(n);
  for (size_t i = 0; i < n; ++i) g[i] = normal(rng), r0[i] = 0.1f * normal(rng), x[i] = g[i] + r0[i];
  DeviceVector dg(cuda, g), dr(cuda, r0);
  std::printf("\nMSTopK at %zu Gaussian elements with the residual (x = g + r), median of %d after 2 warm-up\n", n, reps);
  std::printf("%8s %10s %8s %10s %8s %10s %9s %9s\n", "density", "gpu ms", "passes", "cpu ms", "passes", "exact ms",
              "cpu/gpu", "exact/gpu");
  for (double density : {0.001, 0.01, 0.05}) {
    const size_t k = static_cast<size_t>(std::llround(density * static_cast<double>(n)));
    int32_t* didx = nullptr;
    float* dval = nullptr;
    if (cuda->malloc_device(reinterpret_cast<void**>(&didx), k * sizeof(int32_t)) != SAPIPE_OK ||
        cuda->malloc_device(reinterpret_cast<void**>(&dval), k * sizeof(float)) != SAPIPE_OK) {
      std::printf("topk: %s\n", cuda->last_error());
      return 1;
    }
    std::vector<int32_t> idx(k);
    std::vector<float> val(k);
    std::vector<double> gpu, cpu, exact;
    sapipe_topk_stats gs{}, cs{};
    for (int rep = 0; rep < reps + 2; ++rep) {
      cuda->copy_to_device(dr.ptr, r0.data(), n * sizeof(float), nullptr);
      cuda->stream_synchronize(nullptr);
      sapipe_status st = SAPIPE_OK;
      const double g_ms = time_ms([&] { st = cuda->topk_select(dg.ptr, dr.ptr, n, k, 8, didx, dval, &gs, nullptr); });
      if (st != SAPIPE_OK) {
        std::printf("topk (gpu): %s\n", cuda->last_error());
        return 1;
      }
      r = r0;
      const double c_ms = time_ms([&] { st = sapipe_cpu_topk_select(g.data(), r.data(), n, k, 8, idx.data(), val.data(), &cs); });
      const double e_ms = time_ms([&] { sapipe_cpu_topk_exact(x.data(), n, k, idx.data(), val.data()); });
      if (st != SAPIPE_OK) return 1;
      if (rep >= 2) gpu.push_back(g_ms), cpu.push_back(c_ms), exact.push_back(e_ms);
    }
    cuda->free_device(didx);
    cuda->free_device(dval);
    const double gm = median_of(gpu), cm = median_of(cpu), em = median_of(exact);
    std::printf("%8.3f %10.3f %8d %10.3f %8d %10.3f %9.1f %9.1f\n", density, gm, gs.passes, cm, cs.passes, em, cm / gm, em / gm);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{64} << 20;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  const int device = argc > 3 ? std::atoi(argv[3]) : 0;
  const size_t topk_n = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : size_t{16} << 20;
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
  return topk_n > 0 ? bench_topk(cuda, topk_n, reps > 10 ? 10 : reps) : 0;
}
