// Needs a GPU: the effective bandwidth of every fused update variant (bytes as ALGORITHMS.md
// counts them / median time) and its ratio to a device-to-device copy timed in the same run,
// interleaved. The target (docs/cuda.md) is >= 0.9 of the copy at 64M elements. Then every variant
// launched back to back (the kernel's own time, as PyTorch's steps are timed). Then MSTopK's
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
    // Freed on every way out of this density's runs.
    struct Owned {
      const sapipe_cuda_plugin_v1* cuda;
      void* p = nullptr;
      ~Owned() {
        if (p) cuda->free_device(p);
      }
    } oi{cuda}, ov{cuda};
    if (cuda->malloc_device(&oi.p, k * sizeof(int32_t)) != SAPIPE_OK || cuda->malloc_device(&ov.p, k * sizeof(float)) != SAPIPE_OK) {
      std::printf("topk: %s\n", cuda->last_error());
      return 1;
    }
    didx = static_cast<int32_t*>(oi.p);
    dval = static_cast<float*>(ov.p);
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
      if (st != SAPIPE_OK) {
        std::printf("topk (cpu): status %d\n", static_cast<int>(st));
        return 1;
      }
      const double e_ms = time_ms([&] { st = sapipe_cpu_topk_exact(x.data(), n, k, idx.data(), val.data()); });
      if (st != SAPIPE_OK) {
        std::printf("topk (exact): status %d\n", static_cast<int>(st));
        return 1;
      }
      if (rep >= 2) gpu.push_back(g_ms), cpu.push_back(c_ms), exact.push_back(e_ms);
    }
    const double gm = median_of(gpu), cm = median_of(cpu), em = median_of(exact);
    std::printf("%8.3f %10.3f %8d %10.3f %8d %10.3f %9.1f %9.1f\n", density, gm, gs.passes, cm, cs.passes, em, cm / gm, em / gm);
  }
  return 0;
}

// Each variant launched `inner` times back to back on one stream and timed on the host around
// them (after a synchronize): the launches overlap the kernels, so this is the kernel's own time,
// as PyTorch's optimizer steps are timed in scripts/experiments/torch-fused-optim.py.
int bench_back_to_back(const sapipe_cuda_plugin_v1* cuda, size_t n, int reps, int inner) {
  std::vector<float> host(n);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.0f, 1e-2f);
  for (float& x : host) x = u(rng);
  // The project's device vector (native/tests/device_plugin.h), one per buffer the variants read
  // or write; a failed allocation leaves a null pointer, checked below.
  DeviceVector w(cuda, host), g(cuda, host), m(cuda, host), v(cuda, host), backup(cuda, host), predicted(cuda, host),
      local(cuda, host), prev_local(cuda, host), copy_dst(cuda, host);
  for (const DeviceVector* d : {&w, &g, &m, &v, &backup, &predicted, &local, &prev_local, &copy_dst})
    if (d->ptr == nullptr) {
      std::printf("back to back: %s\n", cuda->last_error());
      return 1;
    }
  sapipe_update_buffers b{};
  b.count = n;
  b.weights = w.ptr, b.grad = g.ptr, b.momentum = m.ptr, b.backup = backup.ptr, b.predicted = predicted.ptr;
  b.local_grad = local.ptr, b.prev_local_grad = prev_local.ptr;
  auto per_call = [&](auto&& launch) -> double {
    std::vector<double> t;
    for (int r = 0; r < reps + 1; ++r) {
      cuda->stream_synchronize(nullptr);
      const double ms = time_ms([&] {
        for (int i = 0; i < inner; ++i) launch();
        cuda->stream_synchronize(nullptr);
      });
      if (r > 0) t.push_back(ms / inner);
    }
    return median_of(t);
  };
  const double copy = per_call([&] { cuda->copy_on_device(copy_dst.ptr, w.ptr, n * sizeof(float), nullptr); });
  std::printf("\nback to back: %d launches per timing, median of %d; copy %.3f ms (%.1f GB/s)\n", inner, reps, copy,
              8.0 * static_cast<double>(n) / (copy * 1e6));
  std::printf("%-40s %10s %9s %8s\n", "variant", "ms", "GB/s", "x copy");
  for (const Variant& var : update_variants()) {
    sapipe_update_config c = var.config;
    c.grad_checked = 1;
    b.second_moment = c.optimizer != SAPIPE_OPTIMIZER_SGD ? v.ptr : nullptr;
    sapipe_status st = SAPIPE_OK;
    const double ms = per_call([&] { st = cuda->update_async(&c, &b, nullptr, nullptr, nullptr); });
    if (st != SAPIPE_OK) {
      std::printf("%s: %s\n", var.name.c_str(), cuda->last_error());
      return 1;
    }
    const double gbps = static_cast<double>(sapipe_update_bytes_per_element(&var.config)) * static_cast<double>(n) / (ms * 1e6);
    std::printf("%-40s %10.3f %9.1f %8.3f\n", var.name.c_str(), ms, gbps, gbps / (8.0 * static_cast<double>(n) / (copy * 1e6)));
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
  if (int s = bench_back_to_back(cuda, n, reps > 10 ? 10 : reps, 20); s != 0) return s;
  return topk_n > 0 ? bench_topk(cuda, topk_n, reps > 10 ? 10 : reps) : 0;
}
