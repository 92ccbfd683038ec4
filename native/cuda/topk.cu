// MSTopK on the device. Four kernels, the host deciding between them as the CPU kernel does:
//  - form_range: x = grad + residual (written into the residual), sum |x| and max |x|;
//  - count_above: #{|x| > t} for the up to 7 thresholds of one sampling pass;
//  - chunk_counts: per chunk of kChunk elements, how many lie above hi and in the band (lo, hi];
//  - select: per chunk, its share of the band fill (first come, in index order) and every element
//    above hi, written in index order from the chunk's offset and zeroed in the residual.
// The chunk counts go to the host, which splits the band fill (core::topk_fill) and sends back
// each chunk's quota and offset: the output is in ascending index order with no global sort.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <vector>

#include "../core/topk_search.h"
#include "device_errors.h"
#include "launch.cuh"
#include "topk.cuh"

namespace sapipe::cuda {
namespace {

constexpr int kItems = 16;                   // elements per thread per chunk
constexpr size_t kChunk = kThreads * kItems;  // elements per select block

__device__ __forceinline__ float warp_max(float x) {
  for (int d = 16; d > 0; d /= 2) x = fmaxf(x, __shfl_down_sync(0xffffffffu, x, d));
  return x;
}

// Block b's sum |x| and max |x| into sums[b] and maxima[b]; the host adds the blocks in order, so
// the mean (and with it the thresholds and the selection) is the same from run to run.
__global__ void form_range_kernel(const float* grad, float* residual, size_t n, double* sums, float* maxima) {
  __shared__ double warp_sums[kThreads / 32];
  __shared__ float warp_maxima[kThreads / 32];
  float s = 0.0f, m = 0.0f;
  SAPIPE_GRID_STRIDE(i, 0, n) {
    float v = grad[i];
    if (residual != nullptr) {
      v += residual[i];
      residual[i] = v;
    }
    const float a = fabsf(v);
    s += a;
    m = fmaxf(m, a);
  }
  const double total = warp_sum(static_cast<double>(s));
  m = warp_max(m);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if ((threadIdx.x & 31) == 0) {
    warp_sums[warp] = total;
    warp_maxima[warp] = m;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double b = 0.0;
    float bm = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) {
      b += warp_sums[w];
      bm = fmaxf(bm, warp_maxima[w]);
    }
    sums[blockIdx.x] = b;
    maxima[blockIdx.x] = bm;
  }
}

struct Thresholds {
  float t[core::kTopkSamples];
  int m;
};

__global__ void count_above_kernel(const float* x, size_t n, Thresholds th, unsigned long long* counts) {
  unsigned int c[core::kTopkSamples] = {0, 0, 0, 0, 0, 0, 0};
  SAPIPE_GRID_STRIDE(i, 0, n) {
    const float a = fabsf(x[i]);
#pragma unroll
    for (int j = 0; j < core::kTopkSamples; ++j) c[j] += (j < th.m && a > th.t[j]) ? 1u : 0u;
  }
#pragma unroll
  for (int j = 0; j < core::kTopkSamples; ++j) {
    const unsigned int w = warp_sum(c[j]);
    if ((threadIdx.x & 31) == 0 && w != 0) atomicAdd(&counts[j], static_cast<unsigned long long>(w));
  }
}

// Block b counts its chunk [b * kChunk, + kChunk): elements above hi and in (lo, hi].
__global__ void chunk_counts_kernel(const float* x, size_t n, float lo, float hi, long long* above, long long* band) {
  __shared__ unsigned int sa, sb;
  if (threadIdx.x == 0) sa = sb = 0;
  __syncthreads();
  const size_t begin = static_cast<size_t>(blockIdx.x) * kChunk;
  const size_t end = begin + kChunk < n ? begin + kChunk : n;
  unsigned int a = 0, b = 0;
  for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float v = fabsf(x[i]);
    a += v > hi ? 1u : 0u;
    b += (v > lo && v <= hi) ? 1u : 0u;
  }
  a = warp_sum(a);
  b = warp_sum(b);
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&sa, a);
    atomicAdd(&sb, b);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    above[blockIdx.x] = sa;
    band[blockIdx.x] = sb;
  }
}

// Block b writes its chunk's selection from offset[b], in index order: tiles of kThreads
// consecutive elements, two block-wide scans per tile (the band elements' ranks, then the
// selected elements' positions). Tiles with nothing above lo are skipped after one vote.
__global__ void select_kernel(const float* x, float* residual, size_t n, float lo, float hi, const long long* quota,
                              const long long* offset, int32_t* out_indices, float* out_values) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  const size_t begin = static_cast<size_t>(blockIdx.x) * kChunk;
  const size_t end = begin + kChunk < n ? begin + kChunk : n;
  long long band_taken = 0;
  const long long band_quota = quota[blockIdx.x];
  long long written = offset[blockIdx.x];
  for (size_t base = begin; base < end; base += kThreads) {
    const size_t i = base + threadIdx.x;
    const float v = i < end ? x[i] : 0.0f;
    const float a = fabsf(v);
    const bool live = i < end && a > lo;
    if (__syncthreads_or(live) == 0) continue;
    const int in_band = (live && a <= hi) ? 1 : 0;
    int band_rank = 0, band_total = 0;
    Scan(scan).ExclusiveSum(in_band, band_rank, band_total);
    __syncthreads();
    const bool take = live && (a > hi || band_taken + band_rank < band_quota);
    int pos = 0, taken = 0;
    Scan(scan).ExclusiveSum(take ? 1 : 0, pos, taken);
    __syncthreads();
    if (take) {
      out_indices[written + pos] = static_cast<int32_t>(i);
      out_values[written + pos] = v;
      if (residual != nullptr) residual[i] = 0.0f;
    }
    band_taken += band_total;
    written += taken;
  }
}

__global__ void scatter_add_kernel(float* out, size_t count, const int32_t* indices, const float* values, size_t n, float scale,
                                   unsigned long long* bad) {
  unsigned int skipped = 0;
  SAPIPE_GRID_STRIDE(i, 0, n) {
    const int32_t j = indices[i];
    if (j < 0 || static_cast<size_t>(j) >= count) {
      ++skipped;
      continue;
    }
    out[j] = __fadd_rn(out[j], __fmul_rn(scale, values[i]));  // rounded twice, as the CPU's
  }
  if (bad == nullptr) return;
  skipped = warp_sum(skipped);
  if ((threadIdx.x & 31) == 0 && skipped != 0) atomicAdd(bad, static_cast<unsigned long long>(skipped));
}

// Device scratch of one selection, freed on every path out.
struct Scratch {
  void* p = nullptr;
  ~Scratch() {
    if (p != nullptr) cudaFree(p);
  }
};

}  // namespace

sapipe_status topk_select(const float* grad, float* residual, size_t count, size_t k, int32_t rounds, int32_t* out_indices,
                          float* out_values, sapipe_topk_stats* stats, cudaStream_t stream) {
  const size_t chunks = count == 0 ? 0 : (count + kChunk - 1) / kChunk;
  const unsigned int blocks = count == 0 ? 0 : grid_for(count);
  // Layout (8-byte slots): the form pass's per-block sums (double) and maxima (float, padded), the
  // sampling pass's counts (7 x u64), then per chunk: above, band, quota, offset (int64 each).
  const size_t head = 2 * blocks * sizeof(double) + core::kTopkSamples * sizeof(unsigned long long);
  Scratch scratch;
  if (sapipe_status s = from_cuda(cudaMalloc(&scratch.p, head + 4 * chunks * sizeof(long long)), "topkSelect scratch"); s != SAPIPE_OK)
    return s;
  auto* sums = static_cast<double*>(scratch.p);
  auto* maxima = reinterpret_cast<float*>(sums + blocks);
  auto* counts = reinterpret_cast<unsigned long long*>(sums + 2 * blocks);
  auto* above = reinterpret_cast<long long*>(static_cast<char*>(scratch.p) + head);
  long long* band = above + chunks;
  long long* quota = band + chunks;
  long long* offset = quota + chunks;

  double sum_abs = 0.0;
  float max_abs = 0.0f;
  if (count != 0) {
    form_range_kernel<<<blocks, kThreads, 0, stream>>>(grad, residual, count, sums, maxima);
    if (sapipe_status s = check_launch("topkSelect form kernel"); s != SAPIPE_OK) return s;
    std::vector<double> host(2 * blocks);
    if (sapipe_status s = from_cuda(cudaMemcpyAsync(host.data(), sums, 2 * blocks * sizeof(double), cudaMemcpyDeviceToHost, stream), "topkSelect");
        s != SAPIPE_OK)
      return s;
    if (sapipe_status s = from_cuda(cudaStreamSynchronize(stream), "topkSelect"); s != SAPIPE_OK) return s;
    const auto* host_maxima = reinterpret_cast<const float*>(host.data() + blocks);
    for (unsigned int b = 0; b < blocks; ++b) {
      sum_abs += host[b];
      max_abs = std::max(max_abs, host_maxima[b]);
    }
  }

  const float* x = residual != nullptr ? residual : grad;
  core::TopkBracket br;
  sapipe_status searched = core::topk_bracket(
      count, k, rounds, sum_abs, max_abs,
      [&](const float* th, int m, int64_t* c) -> sapipe_status {
        Thresholds t{};
        for (int j = 0; j < m; ++j) t.t[j] = th[j];
        t.m = m;
        if (sapipe_status s = from_cuda(cudaMemsetAsync(counts, 0, sizeof(unsigned long long) * core::kTopkSamples, stream), "topkSelect");
            s != SAPIPE_OK)
          return s;
        count_above_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, count, t, counts);
        if (sapipe_status s = check_launch("topkSelect count kernel"); s != SAPIPE_OK) return s;
        unsigned long long host[core::kTopkSamples] = {};
        if (sapipe_status s = from_cuda(cudaMemcpyAsync(host, counts, sizeof host, cudaMemcpyDeviceToHost, stream), "topkSelect"); s != SAPIPE_OK)
          return s;
        if (sapipe_status s = from_cuda(cudaStreamSynchronize(stream), "topkSelect"); s != SAPIPE_OK) return s;
        for (int j = 0; j < m; ++j) c[j] = static_cast<int64_t>(host[j]);
        return SAPIPE_OK;
      },
      &br);
  if (searched != SAPIPE_OK) return searched;
  int passes = br.passes;
  if (k > 0) {
    chunk_counts_kernel<<<static_cast<unsigned int>(chunks), kThreads, 0, stream>>>(x, count, br.lo, br.hi, above, band);
    if (sapipe_status s = check_launch("topkSelect chunk counts kernel"); s != SAPIPE_OK) return s;
    std::vector<long long> host(2 * chunks);
    if (sapipe_status s = from_cuda(cudaMemcpyAsync(host.data(), above, 2 * chunks * sizeof(long long), cudaMemcpyDeviceToHost, stream), "topkSelect");
        s != SAPIPE_OK)
      return s;
    if (sapipe_status s = from_cuda(cudaStreamSynchronize(stream), "topkSelect"); s != SAPIPE_OK) return s;
    ++passes;
    std::vector<int64_t> a(host.begin(), host.begin() + static_cast<std::ptrdiff_t>(chunks));
    std::vector<int64_t> b(host.begin() + static_cast<std::ptrdiff_t>(chunks), host.end());
    std::vector<int64_t> q(chunks), o(chunks);
    if (!core::topk_fill(a.data(), b.data(), chunks, static_cast<int64_t>(k), q.data(), o.data()))
      return fail(SAPIPE_ERR_INTERNAL, "topkSelect: the chunk counts do not make k (was x changed during the selection?)");
    std::vector<long long> qo(2 * chunks);
    for (size_t t = 0; t < chunks; ++t) {
      qo[t] = q[t];
      qo[chunks + t] = o[t];
    }
    if (sapipe_status s = from_cuda(cudaMemcpyAsync(quota, qo.data(), 2 * chunks * sizeof(long long), cudaMemcpyHostToDevice, stream), "topkSelect");
        s != SAPIPE_OK)
      return s;
    select_kernel<<<static_cast<unsigned int>(chunks), kThreads, 0, stream>>>(x, residual, count, br.lo, br.hi, quota, offset,
                                                                             out_indices, out_values);
    if (sapipe_status s = check_launch("topkSelect select kernel"); s != SAPIPE_OK) return s;
    // The scratch (and the host copy of the quotas) must outlive the kernel that reads it.
    if (sapipe_status s = from_cuda(cudaStreamSynchronize(stream), "topkSelect"); s != SAPIPE_OK) return s;
    ++passes;
  }
  if (stats != nullptr) {
    stats->passes = passes;
    stats->lower = br.lo;
    stats->upper = br.hi;
    stats->band = br.c_lo - br.c_hi;
  }
  return SAPIPE_OK;
}

sapipe_status enqueue_scatter_add(float* out, size_t count, const int32_t* indices, const float* values, size_t n, float scale,
                                  int64_t* device_bad, cudaStream_t stream) {
  if (n == 0) return SAPIPE_OK;
  scatter_add_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, count, indices, values, n, scale,
                                                           reinterpret_cast<unsigned long long*>(device_bad));
  return check_launch("scatterAdd kernel");
}

}  // namespace sapipe::cuda
