// The named update variants of apps/bench/kernel-variants.ts as C configurations, for the harnesses.
#pragma once

#include <string>
#include <vector>

#include "sapipe/kernels.h"

namespace sapipe::tests {

struct Variant {
  std::string name;
  sapipe_update_config config;
};

std::vector<Variant> update_variants();

// Every buffer a step may touch, host side, for one variant over n elements.
struct HostState {
  std::vector<float> w, g, m, v, backup, predicted, local, prev_local;
  void fill(size_t n, unsigned seed);
  sapipe_update_buffers buffers(size_t offset, size_t count);
};

// Largest |a - b| / (atol + rtol*|b|) over two arrays: <= 1 passes.
double worst_error(const std::vector<float>& a, const std::vector<float>& b, double rtol, double atol);

}  // namespace sapipe::tests
