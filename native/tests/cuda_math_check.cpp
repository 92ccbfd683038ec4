// Runs without a GPU: the CUDA kernels' per-element maths (native/cuda/update_element.cuh and the
// optim, compensate and predict element functions it calls), compiled for the host, against the
// scalar reference of ALGORITHMS.md for every kernel variant, over several steps and odd sizes,
// to the same tolerance as the CPU kernels. A mistake in the GPU maths fails here, on every
// machine, before any GPU runs it. The loop below does per element what fused_update.cu's kernel
// does per lane: load (absent buffers read as zero), update_element, store the buffers the step has.
// test/native/cuda-math.test.ts runs it; usage: sapipe_cuda_math_check
#include <cstddef>

#include "../core/update_plan.h"
#include "../cuda/update_element.cuh"
#include "check.h"
#include "reference_check.h"
#include "sapipe/kernels.h"
#include "variants.h"

using namespace sapipe;
using namespace sapipe::tests;

namespace {

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

}  // namespace

int main() {
  Checks t;
  check_variants_against_reference(
      t,
      [](const sapipe_update_config& c, HostState& s, size_t offset, size_t n) {
        device_maths_update(c, s, offset, n);
        return true;
      },
      4);
  return t.finish("sapipe_cuda_math_check");
}
