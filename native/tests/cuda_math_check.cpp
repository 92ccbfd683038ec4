// Runs without a GPU: the CUDA kernels' per-element maths (native/cuda/update_element.cuh and the
// optim, compensate and predict element functions it calls), compiled for the host, against the
// scalar reference of ALGORITHMS.md for every kernel variant, over several steps and odd sizes,
// to the same tolerance as the CPU kernels. A mistake in the GPU maths fails here, on every
// machine, before any GPU runs it. The loop below does per element what fused_update.cu's kernel
// does per lane: load (absent buffers read as zero), update_element, store the buffers the step has.
// The model operations' element maths (native/cuda/nn_element.cuh: ReLU and its gradient, the
// softmax cross-entropy's loss and gradient from a row's max and sum, in float as nn_ops.cu
// computes them; GELU and its gradient, the layer norm's output and dx from a row's statistics,
// the dropout mask, the token check) is checked the same way against the CPU table
// (native/cpu/nn_ops.cpp).
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

  // GELU and its gradient (tanh form), lane by lane.
  cpu->gelu(y.data(), x.data(), x.size(), nullptr);
  cpu->gelu_backward(dx.data(), x.data(), dy.data(), x.size(), nullptr);
  double gelu_worst = 0.0, gelu_grad_worst = 0.0;
  bool gelu_special = true;
  for (size_t i = 0; i < x.size(); ++i) {
    const float g = cuda::gelu_element(x[i]), d = cuda::gelu_backward_element(x[i], dy[i]);
    if (!std::isfinite(x[i])) {
      gelu_special = gelu_special && (std::isnan(g) ? std::isnan(y[i]) : g == y[i]);
      continue;
    }
    gelu_worst = std::fmax(gelu_worst, std::fabs(g - y[i]) / (1e-7 + 1e-6 * std::fabs(y[i])));
    gelu_grad_worst = std::fmax(gelu_grad_worst, std::fabs(d - dx[i]) / (1e-7 + 1e-6 * std::fabs(dx[i])));
  }
  t.expect(gelu_worst <= 1.0 && gelu_grad_worst <= 1.0,
           "gelu_element and gelu_backward_element equal the CPU's within 1e-6 relative (worst " + std::to_string(gelu_worst) + ", " +
               std::to_string(gelu_grad_worst) + ")");
  t.expect(gelu_special, "gelu_element gives the CPU's value at NaN and the infinities");

  // Layer norm: the element from the CPU's saved mean and rstd, and dx from float row sums (as
  // the kernel sums them) against the CPU's double sums.
  {
    const size_t rows = 5, cols = 67;
    std::vector<float> in(rows * cols), gamma(cols), beta(cols), out(rows * cols), mean(rows), rstd(rows), g(rows * cols),
        gx(rows * cols), dgamma(cols), dbeta(cols);
    for (float& v : in) v = normal(gen);
    for (float& v : gamma) v = normal(gen);
    for (float& v : beta) v = normal(gen);
    for (float& v : g) v = normal(gen);
    cpu->layer_norm(out.data(), mean.data(), rstd.data(), in.data(), gamma.data(), beta.data(), rows, cols, 1e-5f, nullptr);
    cpu->layer_norm_backward(gx.data(), dgamma.data(), dbeta.data(), g.data(), in.data(), mean.data(), rstd.data(), gamma.data(), rows,
                             cols, 0, nullptr);
    double y_worst = 0.0, dx_worst = 0.0;
    for (size_t r = 0; r < rows; ++r) {
      float sg = 0.0f, sgx = 0.0f;
      for (size_t j = 0; j < cols; ++j) {
        const float gj = g[r * cols + j] * gamma[j];
        sg += gj, sgx += gj * ((in[r * cols + j] - mean[r]) * rstd[r]);
      }
      const float mg = sg / static_cast<float>(cols), mgx = sgx / static_cast<float>(cols);
      for (size_t j = 0; j < cols; ++j) {
        const size_t i = r * cols + j;
        const float e = cuda::layer_norm_element(in[i], mean[r], rstd[r], gamma[j], beta[j]);
        y_worst = std::fmax(y_worst, std::fabs(e - out[i]) / (1e-6 + 1e-6 * std::fabs(out[i])));
        const float d = cuda::layer_norm_dx_element(g[i], gamma[j], (in[i] - mean[r]) * rstd[r], rstd[r], mg, mgx);
        dx_worst = std::fmax(dx_worst, std::fabs(d - gx[i]) / (1e-5 + 1e-5 * std::fabs(gx[i])));
      }
    }
    t.expect(y_worst <= 1.0 && dx_worst <= 1.0, "layer norm: layer_norm_element and layer_norm_dx_element agree with the CPU (worst " +
                                                    std::to_string(y_worst) + ", " + std::to_string(dx_worst) + ")");
  }

  // Dropout draws the CPU's mask exactly, from a counter offset.
  {
    const float p = 0.3f, scale = 1.0f / (1.0f - p);
    const uint64_t seed = 12345, offset = 1000;
    cpu->dropout(y.data(), x.data(), x.size(), p, seed, offset, nullptr);
    bool same = true;
    size_t kept = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float e = cuda::dropout_element(x[i], p, scale, seed, offset + i);
      same = same && (std::isnan(e) ? std::isnan(y[i]) : e == y[i]);
      kept += sapipe_dropout_uniform(seed, offset + i) >= p ? 1 : 0;
    }
    t.expect(same, "dropout_element equals the CPU dropout exactly");
    t.expect(kept > 600 && kept < 800, "dropout keeps about 1 - p of 1001 values (" + std::to_string(kept) + ")");
  }
  // Attention: each row's online softmax in float with online_softmax_step, one key at a time
  // as a warp runs it, against the CPU's (tiles of matrix products); the backward's dq from
  // attention_ds_element against the CPU's.
  {
    const size_t batch = 2, seq = 9, heads = 3, dim = 37, width = heads * dim, n = batch * seq * width;
    std::vector<float> q(n), k(n), v(n), o(n), lse(batch * heads * seq), dout(n), dq(n), dk(n), dv(n);
    for (auto* vec : {&q, &k, &v, &dout})
      for (float& e : *vec) e = normal(gen) / 3.0f;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
    cpu->attention(o.data(), lse.data(), q.data(), k.data(), v.data(), batch, seq, heads, dim, scale, nullptr);
    cpu->attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), o.data(), lse.data(), batch, seq,
                            heads, dim, scale, nullptr);
    const auto at = [&](size_t b, size_t h, size_t i) { return (b * seq + i) * width + h * dim; };
    const auto fdot = [&](const float* a, const float* b) {
      float s = 0.0f;
      for (size_t d = 0; d < dim; ++d) s += a[d] * b[d];
      return s;
    };
    double worst = 0.0;
    for (size_t b = 0; b < batch; ++b)
      for (size_t h = 0; h < heads; ++h)
        for (size_t i = 0; i < seq; ++i) {
          float m = -INFINITY, l = 0.0f;
          std::vector<float> acc(dim, 0.0f), gq(dim, 0.0f);
          for (size_t j = 0; j <= i; ++j) {
            float c, p;
            cuda::online_softmax_step(scale * fdot(&q[at(b, h, i)], &k[at(b, h, j)]), &m, &l, &c, &p);
            for (size_t d = 0; d < dim; ++d) acc[d] = acc[d] * c + p * v[at(b, h, j) + d];
          }
          const float li = m + logf(l), cpu_lse = lse[(b * heads + h) * seq + i];
          worst = std::fmax(worst, std::fabs(li - cpu_lse) / (1e-5 + 1e-5 * std::fabs(cpu_lse)));
          const float d_row = fdot(&dout[at(b, h, i)], &o[at(b, h, i)]);
          for (size_t j = 0; j <= i; ++j) {
            const float p = expf(scale * fdot(&q[at(b, h, i)], &k[at(b, h, j)]) - cpu_lse);
            const float ds = cuda::attention_ds_element(p, fdot(&dout[at(b, h, i)], &v[at(b, h, j)]), d_row);
            for (size_t d = 0; d < dim; ++d) gq[d] += ds * k[at(b, h, j) + d];
          }
          for (size_t d = 0; d < dim; ++d) {
            const float want = o[at(b, h, i) + d], got = acc[d] / l;
            worst = std::fmax(worst, std::fabs(got - want) / (1e-5 + 1e-5 * std::fabs(want)));
            const float gwant = dq[at(b, h, i) + d], ggot = scale * gq[d];
            worst = std::fmax(worst, std::fabs(ggot - gwant) / (1e-5 + 1e-4 * std::fabs(gwant)));
          }
        }
    t.expect(worst <= 1.0, "attention: the online softmax and the score gradient in float agree with the CPU (worst " +
                               std::to_string(worst) + " of 1e-5 + 1e-5 relative, dq 1e-4 relative)");
  }
  // Pooling: the window maths and each input's gathered gradient against the CPU's, exactly (the
  // same sums in the same order), overlapping windows and padding included.
  for (int32_t mode : {SAPIPE_NN_POOL_MAX, SAPIPE_NN_POOL_AVG}) {
    sapipe_nn_conv2d_shape s{2, 3, 9, 8, 3, 3, 2, 2, 1, 1, 1};
    const size_t oh = sapipe_nn_conv_out(s.height, s.kernel_h, s.stride_h, s.pad_h), ow = sapipe_nn_conv_out(s.width, s.kernel_w, s.stride_w, s.pad_w);
    const size_t planes = s.batch * s.in_channels, area = s.height * s.width;
    std::vector<float> in(planes * area), out(planes * oh * ow), g(out.size()), gin(in.size());
    for (float& e : in) e = std::round(normal(gen));  // ties, so the first largest value matters
    in[5] = std::numeric_limits<float>::quiet_NaN();
    for (float& e : g) e = normal(gen);
    cpu->pool2d(out.data(), in.data(), &s, mode, nullptr);
    cpu->pool2d_backward(gin.data(), g.data(), in.data(), &s, mode, nullptr);
    bool same = true;
    for (size_t p = 0; p < planes; ++p) {
      const float* plane = in.data() + p * area;
      for (size_t oy = 0; oy < oh; ++oy)
        for (size_t ox = 0; ox < ow; ++ox) {
          const ptrdiff_t y0 = static_cast<ptrdiff_t>(oy * s.stride_h) - static_cast<ptrdiff_t>(s.pad_h);
          const ptrdiff_t x0 = static_cast<ptrdiff_t>(ox * s.stride_w) - static_cast<ptrdiff_t>(s.pad_w);
          float e = 0.0f;
          if (mode == SAPIPE_NN_POOL_MAX) {
            const size_t at = sapipe_nn_max_pool_at(plane, s.height, s.width, y0, x0, s.kernel_h, s.kernel_w);
            e = at == static_cast<size_t>(-1) ? std::numeric_limits<float>::quiet_NaN() : plane[at];
          } else {
            e = cuda::avg_pool_element(plane, s.height, s.width, y0, x0, s.kernel_h, s.kernel_w);
          }
          const float want = out[(p * oh + oy) * ow + ox];
          same = same && (std::isnan(want) ? std::isnan(e) : e == want);
        }
      for (size_t iy = 0; iy < s.height; ++iy)
        for (size_t ix = 0; ix < s.width; ++ix) {
          const float e = cuda::pool_grad_element(plane, g.data() + p * oh * ow, s.height, s.width, iy, ix, s.kernel_h, s.kernel_w, s.stride_h,
                                                  s.stride_w, s.pad_h, s.pad_w, oh, ow, mode == SAPIPE_NN_POOL_MAX);
          same = same && e == gin[p * area + iy * s.width + ix];
        }
    }
    t.expect(same, std::string(mode == SAPIPE_NN_POOL_MAX ? "max" : "average") +
                       " pooling: the window and the gathered gradient equal the CPU's exactly");
  }
  t.expect(cuda::token_is_valid(3.0f, 4) && !cuda::token_is_valid(4.0f, 4) && !cuda::token_is_valid(1.5f, 4) &&
               !cuda::token_is_valid(-1.0f, 4) && !cuda::token_is_valid(std::numeric_limits<float>::quiet_NaN(), 4),
           "token_is_valid takes the integers below vocab only");
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
