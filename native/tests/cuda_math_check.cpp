// Runs without a GPU: the CUDA kernels' per-element maths (native/cuda/update_element.cuh and the
// optim, compensate and predict element functions it calls), compiled for the host, against the
// scalar reference of ALGORITHMS.md for every kernel variant, over several steps and odd sizes,
// to the same tolerance as the CPU kernels. A mistake in the GPU maths fails here, on every
// machine, before any GPU runs it. The loop below does per element what fused_update.cu's kernel
// does per lane: load (absent buffers read as zero), update_element, store the buffers the step has.
// The model operations' element maths (native/cuda/nn_element.cuh: ReLU and its gradient, the
// softmax cross-entropy's loss and gradient from a row's max and sum, in float as nn_ops.cu
// computes them) is checked the same way against the CPU table (native/cpu/nn_ops.cpp).
// test/native/cuda-math.test.ts runs it; usage: sapipe_cuda_math_check
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../core/update_plan.h"
#include "../cuda/nn_element.cuh"
#include "../cuda/update_element.cuh"
#include "check.h"
#include "reference_check.h"
#include "sapipe/kernels.h"
#include "sapipe/nn.h"
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
  return {core::uses_momentum_buffer(c),
          core::uses_second_moment(c),
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

// The element and row maths of nn_ops.cu's kernels, lane by lane, against the CPU table.
void check_model_operations(Checks& t) {
  const sapipe_nn_ops* cpu = sapipe_cpu_nn_ops();
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(1001);
  for (float& v : x) v = normal(gen);
  x[0] = std::numeric_limits<float>::quiet_NaN(), x[1] = -0.0f, x[2] = INFINITY, x[3] = -INFINITY;
  std::vector<float> y(x.size()), dy(x.size()), dx(x.size());
  for (float& v : dy) v = normal(gen);
  cpu->relu(y.data(), x.data(), x.size(), nullptr);
  cpu->relu_backward(dx.data(), y.data(), dy.data(), x.size(), nullptr);
  bool relu_same = true, grad_same = true;
  for (size_t i = 0; i < x.size(); ++i) {
    relu_same = relu_same && cuda::relu_element(x[i]) == y[i];
    grad_same = grad_same && cuda::relu_backward_element(y[i], dy[i]) == dx[i];
  }
  t.expect(relu_same, "relu_element equals the CPU relu exactly (NaN, -0, infinities)");
  t.expect(grad_same, "relu_backward_element equals the CPU gradient exactly");

  for (size_t classes : {size_t{1}, size_t{10}, size_t{1003}}) {
    const size_t rows = 7;
    std::vector<float> z(rows * classes), labels(rows), losses(rows), d(rows * classes), hits(rows);
    for (float& v : z) v = normal(gen);
    for (size_t r = 0; r < rows; ++r) labels[r] = static_cast<float>(gen() % classes);
    labels[2] = classes > 1 ? 0.5f : -1.0f;  // not a class number
    const float scale = 1.0f / rows;
    cpu->softmax_xent(z.data(), labels.data(), rows, classes, scale, losses.data(), d.data(), hits.data(), nullptr);
    double worst = 0.0;
    bool invalid_ok = true;
    for (size_t r = 0; r < rows; ++r) {
      const float* row = z.data() + r * classes;
      float max = -INFINITY;
      for (size_t j = 0; j < classes; ++j) max = row[j] > max ? row[j] : max;
      float sum = 0.0f;
      for (size_t j = 0; j < classes; ++j) sum += expf(row[j] - max);
      const bool valid = cuda::label_is_class(labels[r], classes);
      if (!valid) {
        invalid_ok = invalid_ok && std::isnan(losses[r]);
        continue;
      }
      const size_t label = static_cast<size_t>(labels[r]);
      const float loss = cuda::xent_loss_element(row[label], max, sum);
      worst = std::fmax(worst, std::fabs(loss - losses[r]) / (1e-6 + 1e-5 * std::fabs(losses[r])));
      for (size_t j = 0; j < classes; ++j) {
        const float g = cuda::xent_grad_element(row[j], max, sum, j == label, scale);
        worst = std::fmax(worst, std::fabs(g - d[r * classes + j]) / (1e-7 + 1e-5 * std::fabs(d[r * classes + j])));
      }
    }
    t.expect(worst <= 1.0, "softmax cross-entropy, " + std::to_string(classes) + " classes: loss and gradient within tolerance (worst " +
                               std::to_string(worst) + ")");
    t.expect(invalid_ok && !cuda::label_is_class(labels[2], classes), "a label that is no class number is refused alike");
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
  check_model_operations(t);
  return t.finish("sapipe_cuda_math_check");
}
