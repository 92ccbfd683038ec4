// Top-k sparsification with error feedback (MSTopK, docs/ALGORITHMS.md section 6), the exact top-k
// it is measured against, and the scatter-add that aggregates sparse contributions.
//
// MSTopK never sorts. One pass forms x = grad + residual (in place in the residual) and the
// range [mean|x|, max|x|]; each sampling pass then counts, in one read of x, the elements above
// kSamples thresholds spread over the current bracket, and keeps the two neighbouring thresholds
// whose counts bracket k, so every pass narrows the bracket (kSamples + 1) times. Sampling stops
// when a count equals k, when the band between the two thresholds holds at most k/64 more
// elements than are still needed, or after `rounds` passes. The selection pass takes every
// element above the upper threshold and fills the rest from the band in index order, so exactly
// k are taken, in ascending index order; it writes their (index, value) pairs and zeroes them in
// the residual (error feedback), or leaves the residual alone without it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "../core/thread_pool.h"
#include "../core/topk_search.h"
#include "sapipe/kernels.h"

// The hot loops are compiled twice, for AVX2 machines and the baseline, the loader picking one
// (the kernel table's dispatch is for the fused update's variants; these are plain loops).
#if defined(__x86_64__) && defined(__GNUC__)
#define SAPIPE_TOPK_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SAPIPE_TOPK_CLONES
#endif

namespace sapipe::cpu {
namespace {

constexpr int kSamples = core::kTopkSamples;
constexpr size_t kBlock = 1024;

// counts[j] += #{ |x_i| > thresholds[j] } over one block: |x| once, then one compare-and-count
// loop per threshold, all in L1.
SAPIPE_TOPK_CLONES void count_block(const float* x, size_t len, const float* thresholds, int m, int64_t* counts) {
  alignas(64) float a[kBlock];
  for (size_t i = 0; i < len; ++i) a[i] = std::fabs(x[i]);
  for (int j = 0; j < m; ++j) {
    const float th = thresholds[j];
    int32_t c = 0;
    for (size_t i = 0; i < len; ++i) c += a[i] > th ? 1 : 0;
    counts[j] += c;
  }
}

// x = grad (+ residual, written back) over one block; adds sum |x| to *sum and folds max |x| into m8.
SAPIPE_TOPK_CLONES void form_block(const float* grad, float* residual, size_t len, double* sum, float* m8) {
  constexpr size_t kLanes = 8;
  float s8[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  if (residual != nullptr) {
    for (; i + kLanes <= len; i += kLanes)
      for (size_t l = 0; l < kLanes; ++l) {
        const float v = grad[i + l] + residual[i + l];
        residual[i + l] = v;
        const float a = std::fabs(v);
        s8[l] += a;
        m8[l] = a > m8[l] ? a : m8[l];
      }
  } else {
    for (; i + kLanes <= len; i += kLanes)
      for (size_t l = 0; l < kLanes; ++l) {
        const float a = std::fabs(grad[i + l]);
        s8[l] += a;
        m8[l] = a > m8[l] ? a : m8[l];
      }
  }
  for (; i < len; ++i) {
    float v = grad[i];
    if (residual != nullptr) {
      v += residual[i];
      residual[i] = v;
    }
    const float a = std::fabs(v);
    s8[0] += a;
    m8[0] = a > m8[0] ? a : m8[0];
  }
  for (float v : s8) *sum += v;
}

// Elements above hi, and in the band (lo, hi], over [b, e).
SAPIPE_TOPK_CLONES void count_above_and_band(const float* x, size_t b, size_t e, float lo, float hi, int64_t* above, int64_t* band) {
  int64_t a = 0, d = 0;
  for (size_t blk = b; blk < e; blk += kBlock) {
    const size_t end = std::min(e, blk + kBlock);
    int32_t ab = 0, bd = 0;
    for (size_t i = blk; i < end; ++i) {
      const float v = std::fabs(x[i]);
      ab += v > hi ? 1 : 0;
      bd += (v > lo) & (v <= hi) ? 1 : 0;
    }
    a += ab;
    d += bd;
  }
  *above = a;
  *band = d;
}
constexpr size_t kChunkAlign = 16;

struct Range {
  double sum_abs = 0;
  float max_abs = 0;
};

// x = grad + residual into residual (error feedback) and the range of |x|.
Range form_and_range(const float* grad, float* residual, size_t n) {
  ThreadPool& pool = ThreadPool::current();
  std::vector<Range> part(static_cast<size_t>(pool.size()));
  pool.parallel_for(n, kChunkAlign, [&](int t, size_t lo, size_t hi) {
    // Eight independent lanes (form_block), so the sums and maxima vectorise; each block's
    // lanes are added up in double.
    double sum = 0;
    float m8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t b = lo; b < hi; b += kBlock) form_block(grad + b, residual != nullptr ? residual + b : nullptr, std::min(kBlock, hi - b), &sum, m8);
    float mx = 0;
    for (float v : m8) mx = v > mx ? v : mx;
    part[static_cast<size_t>(t)] = {sum, mx};
  });
  Range r;
  for (const Range& p : part) {
    r.sum_abs += p.sum_abs;
    r.max_abs = std::max(r.max_abs, p.max_abs);
  }
  return r;
}

// counts[j] = #{ |x_i| > thresholds[j] } for m thresholds, one read of x.
void count_above(const float* x, size_t n, const float* thresholds, int m, int64_t* counts) {
  ThreadPool& pool = ThreadPool::current();
  std::vector<int64_t> part(static_cast<size_t>(pool.size()) * kSamples, 0);
  pool.parallel_for(n, kChunkAlign, [&](int t, size_t lo, size_t hi) {
    int64_t c[kSamples] = {0, 0, 0, 0, 0, 0, 0};
    for (size_t b = lo; b < hi; b += kBlock) count_block(x + b, std::min(kBlock, hi - b), thresholds, m, c);
    std::memcpy(&part[static_cast<size_t>(t) * kSamples], c, sizeof c);
  });
  for (int j = 0; j < m; ++j) {
    counts[j] = 0;
    for (int t = 0; t < pool.size(); ++t) counts[j] += part[static_cast<size_t>(t) * kSamples + j];
  }
}

// The selection over [b, e): every |x| > hi and the first `quota` in (lo, hi], written from
// out position o in index order, zeroed in the residual. Groups of 16 with no |x| > lo (most of
// them at small densities) are skipped after one vectorised test.
SAPIPE_TOPK_CLONES void select_range(const float* x, float* residual, size_t b, size_t e, float lo, float hi, int64_t quota, int64_t o,
                                     int32_t* out_indices, float* out_values) {
  constexpr size_t kGroup = 16;
  size_t i = b;
  auto one = [&](size_t j) {
    const float v = x[j];
    const float a = std::fabs(v);
    if (a > hi || (quota > 0 && a > lo && a <= hi && (--quota, true))) {
      out_indices[o] = static_cast<int32_t>(j);
      out_values[o] = v;
      ++o;
      if (residual != nullptr) residual[j] = 0.0f;
    }
  };
  for (; i + kGroup <= e; i += kGroup) {
    int any = 0;
    for (size_t l = 0; l < kGroup; ++l) any |= std::fabs(x[i + l]) > lo ? 1 : 0;
    if (any == 0) continue;
    for (size_t l = 0; l < kGroup; ++l) one(i + l);
  }
  for (; i < e; ++i) one(i);
}

}  // namespace
}  // namespace sapipe::cpu

using namespace sapipe;
using namespace sapipe::cpu;

extern "C" {

sapipe_status sapipe_cpu_topk_select(const float* grad, float* residual, size_t count, size_t k, int32_t rounds,
                                     int32_t* out_indices, float* out_values, sapipe_topk_stats* stats) {
  if (grad == nullptr || (k > 0 && (out_indices == nullptr || out_values == nullptr)) || rounds < 0) return SAPIPE_ERR_INVALID_ARGUMENT;
  if (count > static_cast<size_t>(INT32_MAX) || k > count) return SAPIPE_ERR_INVALID_ARGUMENT;
  const Range range = form_and_range(grad, residual, count);
  const float* x = residual != nullptr ? residual : grad;
  core::TopkBracket br;
  core::topk_bracket(
      count, k, rounds, range.sum_abs, range.max_abs,
      [&](const float* th, int m, int64_t* c) {
        count_above(x, count, th, m, c);
        return SAPIPE_OK;
      },
      &br);
  const float lo = br.lo, hi = br.hi;
  int passes = br.passes;
  // Per chunk: how many above hi and in the band (lo, hi], then each chunk's share of the band
  // fill in index order and its output offset.
  ThreadPool& pool = ThreadPool::current();
  const size_t chunks = static_cast<size_t>(pool.size());
  std::vector<int64_t> above(chunks, 0), band(chunks, 0);
  if (k > 0) {
    pool.parallel_for(count, kChunkAlign, [&](int t, size_t b, size_t e) {
      count_above_and_band(x, b, e, lo, hi, &above[static_cast<size_t>(t)], &band[static_cast<size_t>(t)]);
    });
    ++passes;
  }
  std::vector<int64_t> quota(chunks, 0), offset(chunks, 0);
  if (!core::topk_fill(above.data(), band.data(), chunks, static_cast<int64_t>(k), quota.data(), offset.data()) && k > 0)
    return SAPIPE_ERR_INTERNAL;
  if (k > 0) {
    pool.parallel_for(count, kChunkAlign, [&](int t, size_t b, size_t e) {
      const size_t ti = static_cast<size_t>(t);
      select_range(x, residual, b, e, lo, hi, quota[ti], offset[ti], out_indices, out_values);
    });
    ++passes;
  }
  if (stats != nullptr) {
    stats->passes = passes;
    stats->lower = lo;
    stats->upper = hi;
    stats->band = br.c_lo - br.c_hi;
  }
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_topk_exact(const float* x, size_t count, size_t k, int32_t* out_indices, float* out_values) {
  if (x == nullptr || k > count || count > static_cast<size_t>(INT32_MAX) || (k > 0 && (out_indices == nullptr || out_values == nullptr)))
    return SAPIPE_ERR_INVALID_ARGUMENT;
  if (k == 0) return SAPIPE_OK;
  std::vector<int32_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  // Largest |x| first; ties by index, so the choice is deterministic.
  auto larger = [x](int32_t a, int32_t b) {
    const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
    return fa > fb || (fa == fb && a < b);
  };
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k - 1), order.end(), larger);
  std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  for (size_t i = 0; i < k; ++i) {
    out_indices[i] = order[i];
    out_values[i] = x[order[i]];
  }
  return SAPIPE_OK;
}

sapipe_status sapipe_cpu_scatter_add(float* out, size_t count, const int32_t* indices, const float* values, size_t n, float scale) {
  if (out == nullptr || (n > 0 && (indices == nullptr || values == nullptr))) return SAPIPE_ERR_INVALID_ARGUMENT;
  for (size_t i = 0; i < n; ++i)
    if (indices[i] < 0 || static_cast<size_t>(indices[i]) >= count) return SAPIPE_ERR_INVALID_ARGUMENT;
  for (size_t i = 0; i < n; ++i) out[indices[i]] += scale * values[i];
  return SAPIPE_OK;
}

}  // extern "C"
