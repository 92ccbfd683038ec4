// How a range of n elements is split among ranks: equal parts whose boundaries fall on cache
// lines (16 floats), so that no two ranks write the same line of a peer's buffer.
#pragma once

#include <cstddef>
#include <utility>

namespace sapipe::comm {

inline std::pair<size_t, size_t> partition(size_t n, int parts, int index) {
  constexpr size_t kAlign = 16;
  size_t chunk = (n + static_cast<size_t>(parts) - 1) / static_cast<size_t>(parts);
  chunk = (chunk + kAlign - 1) / kAlign * kAlign;
  size_t lo = chunk * static_cast<size_t>(index);
  if (lo > n) lo = n;
  size_t hi = lo + chunk > n ? n : lo + chunk;
  return {lo, hi};
}

}  // namespace sapipe::comm
