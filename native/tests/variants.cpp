// The variant table and host-side buffers the harnesses share.
#include "variants.h"

#include <cmath>
#include <random>

namespace sapipe::tests {

std::vector<Variant> update_variants() {
  auto base = [] {
    sapipe_update_config c{};
    c.spike_delay = -1;
    c.beta1 = 0.9f, c.beta2 = 0.999f, c.eps = 1e-8f;
    c.step = 1, c.grad_scale = 1, c.world_size = 1, c.local_grad_scale = 1;
    c.compensation_lambda = 0.2f, c.compensation_eps = 1e-7f;
    return c;
  };
  auto sgd = [&](float mu) {
    auto c = base();
    c.optimizer = SAPIPE_OPTIMIZER_SGD, c.lr = 0.01f, c.weight_decay = 1e-4f, c.momentum = mu;
    return c;
  };
  auto adam = [&](int kind) {
    auto c = base();
    c.optimizer = kind, c.lr = 1e-3f, c.weight_decay = kind == SAPIPE_OPTIMIZER_ADAMW ? 1e-2f : 1e-4f;
    return c;
  };
  auto dc = [](sapipe_update_config c, int kind) {
    c.compensation = kind;
    return c;
  };
  auto wp = [](sapipe_update_config c, int estimate, bool compensate = false) {
    c.prediction = SAPIPE_PREDICTION_SHADOW_STEP, c.estimate = estimate, c.world_size = 4, c.compensate_estimate = compensate;
    return c;
  };
  auto linear = [](sapipe_update_config c, float s) {
    c.prediction = SAPIPE_PREDICTION_LINEAR, c.prediction_steps = s;
    return c;
  };
  auto nesterov = sgd(0.9f);
  nesterov.nesterov = 1;
  auto damp = sgd(0.9f);
  damp.dampening = 0.1f;
  // Spike compensation at the delays of Pipelined Backpropagation's stages (D_k = 2(S-k)-1).
  auto spike = [&](int delay) {
    auto c = sgd(0.9f);
    c.spike_delay = delay;
    return c;
  };
  auto scaled = adam(SAPIPE_OPTIMIZER_ADAM);
  scaled.grad_scale = 0.25f;
  const int A = SAPIPE_OPTIMIZER_ADAM, W = SAPIPE_OPTIMIZER_ADAMW, E = SAPIPE_COMPENSATION_ELEMENTWISE,
            D = SAPIPE_COMPENSATION_ADAPTIVE, L = SAPIPE_ESTIMATE_LOCAL, P = SAPIPE_ESTIMATE_PREV_SYNC,
            LP = SAPIPE_ESTIMATE_LOCAL_PREV_SYNC;
  // The same names, order and settings as KERNEL_VARIANTS in apps/bench/kernel-variants.ts (the list the
  // benchmarks and the TypeScript tests use); test/native/lists.test.ts fails when they drift.
  return {
      {"sgd", sgd(0)},
      {"sgd-momentum", sgd(0.9f)},
      {"sgd-nesterov", nesterov},
      {"sgd-momentum-dampening", damp},
      {"adam", adam(A)},
      {"adamw", adam(W)},
      {"adam-grad-scale", scaled},
      {"sgd-momentum+dc", dc(sgd(0.9f), E)},
      {"sgd-momentum+dc-adaptive", dc(sgd(0.9f), D)},
      {"adam+dc", dc(adam(A), E)},
      {"adamw+dc-adaptive", dc(adam(W), D)},
      {"sgd+wp-prev-sync", wp(sgd(0), P)},
      {"sgd-momentum+wp-local", wp(sgd(0.9f), L)},
      {"sgd-momentum+wp-prev-sync", wp(sgd(0.9f), P)},
      {"sgd-momentum+wp-local-prev-sync", wp(sgd(0.9f), LP)},
      {"sgd-nesterov+wp-local", wp(nesterov, L)},
      {"adam+wp-local", wp(adam(A), L)},
      {"adam+wp-prev-sync", wp(adam(A), P)},
      {"adamw+wp-local-prev-sync", wp(adam(W), LP)},
      {"sgd-momentum+dc+wp-local-prev-sync-dc", wp(dc(sgd(0.9f), E), LP, true)},
      {"adam+dc+wp-local-dc", wp(dc(adam(A), E), L, true)},
      {"adamw+dc-adaptive+wp-prev-sync-dc", wp(dc(adam(W), D), P, true)},
      {"sgd+linear", linear(sgd(0), 2)},
      {"sgd-momentum+pipeoptim", linear(sgd(0.9f), 3)},
      {"adam+pipeoptim", linear(adam(A), 3)},
      {"adamw+pipeoptim", linear(adam(W), 3)},
      {"sgd-spike", spike(5)},
      {"sgd-spike+lwp", linear(spike(5), 5)},
      {"sgd-spike+wp-local", wp(spike(2), L)},
  };
}

void HostState::fill(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto f = [&](std::vector<float>& x, float lo, float hi) {
    x.resize(n);
    for (float& e : x) e = lo + (hi - lo) * (u(rng) + 1.0f) / 2.0f;
  };
  f(w, -1, 1), f(g, -0.5f, 0.5f), f(m, -0.1f, 0.1f), f(v, 0, 0.01f), f(backup, -1, 1), f(predicted, 0, 0);
  f(local, -0.5f, 0.5f), f(prev_local, -0.5f, 0.5f);
}

sapipe_update_buffers HostState::buffers(size_t offset, size_t count) {
  sapipe_update_buffers b{};
  b.offset = offset, b.count = count;
  b.weights = w.data(), b.grad = g.data(), b.momentum = m.data(), b.second_moment = v.data(), b.backup = backup.data();
  b.predicted = predicted.data(), b.local_grad = local.data(), b.prev_local_grad = prev_local.data();
  return b;
}

double worst_error(const std::vector<float>& a, const std::vector<float>& b, double rtol, double atol) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double e = std::fabs(static_cast<double>(a[i]) - b[i]) / (atol + rtol * std::fabs(static_cast<double>(b[i])));
    if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
  }
  return worst;
}

}  // namespace sapipe::tests
