// The host-side part of MSTopK (docs/ALGORITHMS.md section 6) that the CPU kernel
// (native/cpu/topk.cpp) and the CUDA one (native/cuda/topk.cu) share: the threshold search by
// multiple sampling, which only needs counts of elements above thresholds (each backend counts
// over its own memory), and the split of the band fill between chunks, which only needs each
// chunk's counts. One source, so both backends pick the same bracket from the same counts.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "sapipe/status.h"

namespace sapipe::core {

// Thresholds counted per sampling pass.
constexpr int kTopkSamples = 7;

// c(t) = #{|x| > t}: every |x| > hi is taken, then the first k - c_hi of the band (lo, hi] in
// index order. passes: the sampling passes run.
struct TopkBracket {
  float lo = -1.0f;
  float hi = 0.0f;
  int64_t c_lo = 0;
  int64_t c_hi = 0;
  int passes = 0;
};

// The bracket for k of count elements whose |x| sums to sum_abs with maximum max_abs.
// count_above(thresholds, m, counts) fills counts[j] = #{|x| > thresholds[j]} for m ascending
// thresholds (m <= kTopkSamples) in one read of x and returns a status. The first pass samples
// mean|x| itself and six thresholds over (mean, max); every later pass kTopkSamples over the open
// bracket. Sampling stops when a count equals k, when the band holds at most k/64 more elements
// than are still needed, after rounds + 1 passes, or when the bracket is as narrow as floats go.
template <class CountAbove>
sapipe_status topk_bracket(size_t count, size_t k, int32_t rounds, double sum_abs, float max_abs, CountAbove&& count_above,
                           TopkBracket* out) {
  TopkBracket b;
  b.lo = -1.0f;
  b.hi = max_abs;
  b.c_lo = static_cast<int64_t>(count);
  b.c_hi = 0;
  const int64_t want = static_cast<int64_t>(k);
  if (count > 0 && k > 0 && k < count) {
    const float mean = static_cast<float>(sum_abs / static_cast<double>(count));
    for (int r = 0; r < rounds + 1 && b.c_lo != want && b.c_hi != want && b.c_lo - want > want / 64 && b.hi > b.lo; ++r) {
      float th[kTopkSamples];
      int m = 0;
      const float from = r == 0 ? mean : b.lo;
      if (r == 0 && mean > b.lo && mean < b.hi) th[m++] = mean;
      const int slots = r == 0 ? kTopkSamples - 1 : kTopkSamples;
      for (int j = 1; j <= slots && m < kTopkSamples; ++j) {
        const float t = from + (b.hi - from) * (static_cast<float>(j) / static_cast<float>(slots + 1));
        if (t > b.lo && t < b.hi && (m == 0 || t > th[m - 1])) th[m++] = t;
      }
      if (m == 0) break;  // the bracket is as narrow as floats go
      int64_t c[kTopkSamples];
      if (sapipe_status s = count_above(th, m, c); s != SAPIPE_OK) return s;
      ++b.passes;
      for (int j = 0; j < m; ++j) {
        if (c[j] >= want) {
          b.lo = th[j];
          b.c_lo = c[j];
        } else {
          b.hi = th[j];
          b.c_hi = c[j];
          break;
        }
      }
    }
  }
  if (k >= count) {
    b.lo = -1.0f;
    b.c_lo = static_cast<int64_t>(count);
  }
  // An exact hit: everything above that threshold and nothing from a band.
  if (b.c_lo == want) {
    b.hi = b.lo;
    b.c_hi = b.c_lo;
  }
  *out = b;
  return SAPIPE_OK;
}

// Chunk t holds above[t] elements above hi and band[t] in the band; the band is filled in index
// order, so chunk t takes quota[t] of its band and writes from offset[t]. False when the counts
// cannot make exactly `want` (they came from another x).
inline bool topk_fill(const int64_t* above, const int64_t* band, size_t chunks, int64_t want, int64_t* quota, int64_t* offset) {
  int64_t total_above = 0;
  for (size_t t = 0; t < chunks; ++t) total_above += above[t];
  int64_t fill = want - total_above;
  int64_t at = 0;
  for (size_t t = 0; t < chunks; ++t) {
    quota[t] = std::min(band[t], std::max<int64_t>(fill, 0));
    fill -= quota[t];
    offset[t] = at;
    at += above[t] + quota[t];
  }
  return at == want;
}

}  // namespace sapipe::core
