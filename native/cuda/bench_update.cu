// Each variant's runs are interleaved with copy runs on the same stream, and each is timed with
// its own pair of events; the medians are reported. Buffers hold distinct values (a constant fill
// could be compressed by the memory system and measure less traffic than counted).
#include <algorithm>
#include <tuple>
#include <vector>

#include "bench_update.cuh"
#include "device_errors.h"
#include "fused_update.cuh"
#include "launch.cuh"

namespace sapipe::cuda {
namespace {

__global__ void fill_distinct_kernel(float* x, size_t n, uint32_t seed, float lo, float hi) {
  SAPIPE_GRID_STRIDE(i, 0, n) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16, h *= 0x7feb352du, h ^= h >> 15, h *= 0x846ca68bu, h ^= h >> 16;
    x[i] = lo + (hi - lo) * (static_cast<float>(h >> 8) * (1.0f / 16777216.0f));
  }
}

struct DeviceMemory {
  std::vector<void*> owned;
  ~DeviceMemory() {
    for (void* p : owned) cudaFree(p);
  }
  sapipe_status alloc(float** p, size_t n, uint32_t seed, float lo, float hi) {
    void* raw = nullptr;
    if (sapipe_status s = from_cuda(cudaMalloc(&raw, n * sizeof(float) + 16), "bench: cudaMalloc"); s != SAPIPE_OK) return s;
    owned.push_back(raw);
    *p = static_cast<float*>(raw);
    fill_distinct_kernel<<<grid_for(n), kThreads>>>(*p, n, seed, lo, hi);
    return check_launch("bench: fill");
  }
};

struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  ~Events() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

sapipe_status bench_update(const sapipe_update_config& config, size_t count, int reps, int warmup,
                           sapipe_cuda_bench_result* out) {
  if (count == 0 || reps < 1 || warmup < 0) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "bench: count and reps must be positive");
  DeviceMemory mem;
  sapipe_update_buffers b{};
  b.count = count;
  float *w, *g, *m, *v, *backup, *predicted, *local, *prev_local, *copy_src, *copy_dst;
  const bool second_moment = core::uses_second_moment(config);
  for (auto [ptr, seed, lo, hi] : {std::tuple{&w, 1u, -1.0f, 1.0f}, std::tuple{&g, 2u, -0.01f, 0.01f},
                                   std::tuple{&m, 3u, -0.01f, 0.01f}, std::tuple{&v, 4u, 0.0f, 1e-4f},
                                   std::tuple{&backup, 5u, -1.0f, 1.0f}, std::tuple{&predicted, 6u, 0.0f, 0.0f},
                                   std::tuple{&local, 7u, -0.01f, 0.01f}, std::tuple{&prev_local, 8u, -0.01f, 0.01f},
                                   std::tuple{&copy_src, 9u, -1.0f, 1.0f}, std::tuple{&copy_dst, 10u, 0.0f, 0.0f}})
    if (sapipe_status s = mem.alloc(ptr, count, seed, lo, hi); s != SAPIPE_OK) return s;
  b.weights = w, b.grad = g, b.momentum = m, b.second_moment = second_moment ? v : nullptr, b.backup = backup;
  b.predicted = predicted, b.local_grad = local, b.prev_local_grad = prev_local;
  int64_t* guard = nullptr;
  if (sapipe_status s = from_cuda(cudaMalloc(reinterpret_cast<void**>(&guard), sizeof(int64_t)), "bench: cudaMalloc");
      s != SAPIPE_OK)
    return s;
  mem.owned.push_back(guard);
  Events ev;
  if (sapipe_status s = from_cuda(cudaEventCreate(&ev.start), "bench: event"); s != SAPIPE_OK) return s;
  if (sapipe_status s = from_cuda(cudaEventCreate(&ev.stop), "bench: event"); s != SAPIPE_OK) return s;
  sapipe_update_config checked = config, guarded = config;
  checked.grad_checked = 1;
  guarded.grad_checked = 0;
  std::vector<double> update_ms, guarded_ms, copy_ms;
  auto time = [&](auto&& body, std::vector<double>* into) -> sapipe_status {
    cudaEventRecord(ev.start, nullptr);
    if (sapipe_status s = body(); s != SAPIPE_OK) return s;
    cudaEventRecord(ev.stop, nullptr);
    if (sapipe_status s = from_cuda(cudaEventSynchronize(ev.stop), "bench: synchronize"); s != SAPIPE_OK) return s;
    float ms = 0;
    cudaEventElapsedTime(&ms, ev.start, ev.stop);
    if (into) into->push_back(ms);
    return SAPIPE_OK;
  };
  auto update = [&] { return enqueue_fused_update(checked, b, nullptr, nullptr, nullptr); };
  auto step = [&] { return enqueue_fused_update(guarded, b, nullptr, guard, nullptr); };
  auto copy = [&] {
    return from_cuda(cudaMemcpyAsync(copy_dst, copy_src, count * sizeof(float), cudaMemcpyDeviceToDevice, nullptr),
                     "bench: copy");
  };
  for (int r = 0; r < warmup + reps; ++r) {
    const bool measured = r >= warmup;
    if (sapipe_status s = time(update, measured ? &update_ms : nullptr); s != SAPIPE_OK) return s;
    if (sapipe_status s = time(step, measured ? &guarded_ms : nullptr); s != SAPIPE_OK) return s;
    if (sapipe_status s = time(copy, measured ? &copy_ms : nullptr); s != SAPIPE_OK) return s;
  }
  out->update_ms = median(update_ms);
  out->guarded_ms = median(guarded_ms);
  out->copy_ms = median(copy_ms);
  out->bytes_per_element = sapipe_update_bytes_per_element(&config);
  return SAPIPE_OK;
}

}  // namespace sapipe::cuda
