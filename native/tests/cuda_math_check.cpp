// Runs without a GPU: the CUDA kernels' per-element maths (native/cuda/update_element.cuh and the
// optim, compensate and predict element functions it calls), compiled for the host, against the
// scalar reference of ALGORITHMS.md for every kernel variant, over several steps and odd sizes,
// to the same tolerance as the CPU kernels. A mistake in the GPU maths fails here, on every
// machine, before any GPU runs it. The loop below does per element what fused_update.cu's kernel
// does per lane: load (absent buffers read as zero), update_element, store the buffers the step has.
// test/native/cuda-math.test.ts runs it; usage: sapipe_cuda_math_check
#include <cmath>
#include <string>
#include <vector>

#include "../core/update_plan.h"
#include "../cuda/update_element.cuh"
#include "check.h"
#include "sapipe/kernels.h"
#include "scalar_reference.h"
#include "variants.h"

using namespace sapipe;
using namespace sapipe::tests;

namespace {

const size_t kSizes[] = {1, 3, 17, 1000, 4099};
constexpr double kRtol = 2e-5, kAtol = 1e-6;

// Which buffers a step has, as fused_update.cu's device_buffers() decides.
struct Present {
  bool m, v, backup, predicted, local, prev_local;
};

Present present(const sapipe_update_config& c) {
  const bool shadow = c.prediction == SAPIPE_PREDICTION_SHADOW_STEP;
  return {c.optimizer != SAPIPE_OPTIMIZER_SGD || c.momentum != 0.0f,
          c.optimizer != SAPIPE_OPTIMIZER_SGD,
          c.compensation != SAPIPE_COMPENSATION_NONE,
          c.prediction != SAPIPE_PREDICTION_NONE,
          shadow && c.estimate != SAPIPE_ESTIMATE_PREV_SYNC,
          shadow && c.estimate == SAPIPE_ESTIMATE_LOCAL_PREV_SYNC};
}

// The GPU step of elements [offset, offset + count), lane by lane on the host.
void device_maths_update(const sapipe_update_config& config, HostState& s, size_t offset, size_t count) {
  const core::UpdatePlan plan = core::make_update_plan(config);
  const Present has = present(config);
  for (size_t i = offset; i < offset + count; ++i) {
    float w = s.w[i], m = has.m ? s.m[i] : 0.f, v = has.v ? s.v[i] : 0.f, c = has.backup ? s.backup[i] : 0.f;
    float pl = has.prev_local ? s.prev_local[i] : 0.f;
    const float wh = cuda::update_element(plan, w, s.g[i], m, v, c, has.local ? s.local[i] : 0.f, pl);
    s.w[i] = w;
    if (has.m) s.m[i] = m;
    if (has.v) s.v[i] = v;
    if (has.backup) s.backup[i] = c;
    if (has.prev_local) s.prev_local[i] = pl;
    if (has.predicted) s.predicted[i] = wh;
  }
}

void check_variants(Checks& t) {
  for (const Variant& variant : update_variants()) {
    for (size_t n : kSizes) {
      HostState gpu, ref;
      gpu.fill(n + 8, static_cast<unsigned>(n * 31 + variant.name.size()));
      ref = gpu;
      const size_t offset = n % 2 == 1 ? 3 : 0;
      for (int step = 1; step <= 4; ++step) {
        sapipe_update_config c = variant.config;
        c.step = step;
        c.momentum_is_empty = step == 1;
        c.have_prev_local = step > 1;
        device_maths_update(c, gpu, offset, n);
        sapipe_update_buffers br = ref.buffers(offset, n);
        const bool applied = reference_update(c, br);
        const std::string where = variant.name + " n=" + std::to_string(n) + " step " + std::to_string(step);
        t.expect(applied, where + ": the reference applied the step");
        const std::pair<const char*, std::pair<std::vector<float>*, std::vector<float>*>> outputs[] = {
            {"w", {&gpu.w, &ref.w}},           {"m", {&gpu.m, &ref.m}},
            {"v", {&gpu.v, &ref.v}},           {"backup", {&gpu.backup, &ref.backup}},
            {"w_hat", {&gpu.predicted, &ref.predicted}}, {"prev_local", {&gpu.prev_local, &ref.prev_local}}};
        for (const auto& [name, pair] : outputs) {
          const double e = worst_error(*pair.first, *pair.second, kRtol, kAtol);
          t.expect(e <= 1.0, where + ": " + name + " within tolerance (worst " + std::to_string(e) + ")");
        }
      }
    }
  }
}

}  // namespace

int main() {
  Checks t;
  check_variants(t);
  return t.finish("sapipe_cuda_math_check");
}
