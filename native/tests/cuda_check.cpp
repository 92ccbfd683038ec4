// Needs a GPU: every CUDA kernel of the plugin against the CPU kernels on the same random data,
// through the plugin's C ABI (as the addon uses it). Sizes cover the float4 body and scalar tails;
// offsets cover the unaligned (scalar-only) path; three steps per variant. Also the non-finite
// guard (nothing written on device), the bf16 copy of w_hat, every helper kernel, and MSTopK with
// the scatter-add. With NCCL:
// a one-rank communicator through the appended entries (collectives, stream_query, the async
// error, and the fused replicated and sharded steps and their recheck, against the CPU update).
// usage: sapipe_cuda_check [device]
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "device_plugin.h"
#include "sapipe/kernels.h"
#include "variants.h"

using namespace sapipe;
using namespace sapipe::tests;

namespace {

// The GPU contracts multiply-adds into FMAs; the CPU build does not: a few ulps apart per step.
constexpr double kRtol = 1e-5, kAtol = 1e-6;

struct DeviceState {
  DeviceVector w, g, m, v, backup, predicted, local, prev_local;
  DeviceState(const sapipe_cuda_plugin_v1* c, const HostState& h)
      : w(c, h.w), g(c, h.g), m(c, h.m), v(c, h.v), backup(c, h.backup), predicted(c, h.predicted), local(c, h.local),
        prev_local(c, h.prev_local) {}
  sapipe_update_buffers buffers(size_t offset, size_t count) {
    sapipe_update_buffers b{};
    b.offset = offset, b.count = count;
    b.weights = w.ptr, b.grad = g.ptr, b.momentum = m.ptr, b.second_moment = v.ptr, b.backup = backup.ptr;
    b.predicted = predicted.ptr, b.local_grad = local.ptr, b.prev_local_grad = prev_local.ptr;
    return b;
  }
};

float bf16_round(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  bits &= 0xffff0000u;
  std::memcpy(&x, &bits, 4);
  return x;
}

void check_updates(Checks& t, const sapipe_cuda_plugin_v1* cuda) {
  const size_t sizes[] = {1, 3, 4, 17, 1000, 4099, (1u << 20) + 3};
  for (const Variant& variant : update_variants()) {
    for (size_t n : sizes) {
      for (size_t offset : {size_t{0}, size_t{1}, size_t{4}}) {
        HostState host;
        host.fill(n + offset + 4, static_cast<unsigned>(n + offset));
        DeviceState dev(cuda, host);
        uint16_t* bf16 = nullptr;
        cuda->malloc_device(reinterpret_cast<void**>(&bf16), (n + offset + 4) * sizeof(uint16_t));
        const std::string where = variant.name + " n=" + std::to_string(n) + " offset=" + std::to_string(offset);
        bool ok = true;
        for (int step = 1; step <= 3; ++step) {
          sapipe_update_config c = variant.config;
          c.step = step, c.momentum_is_empty = step == 1, c.have_prev_local = step > 1;
          sapipe_update_buffers hb = host.buffers(offset, n), db = dev.buffers(offset, n);
          sapipe_update_result hr{}, dr{};
          ok = ok && sapipe_cpu_update(&c, &hb, &hr) == SAPIPE_OK && hr.applied == 1;
          const sapipe_status s = cuda->update(&c, &db, bf16, &dr, nullptr);
          ok = ok && s == SAPIPE_OK && dr.applied == 1;
          if (s != SAPIPE_OK) std::printf("  %s: %s\n", where.c_str(), cuda->last_error());
        }
        t.expect(ok, where + ": applied on both");
        const std::pair<const char*, std::pair<const std::vector<float>*, const DeviceVector*>> outputs[] = {
            {"w", {&host.w, &dev.w}},           {"m", {&host.m, &dev.m}},
            {"v", {&host.v, &dev.v}},           {"backup", {&host.backup, &dev.backup}},
            {"w_hat", {&host.predicted, &dev.predicted}}, {"prev_local", {&host.prev_local, &dev.prev_local}}};
        for (const auto& [name, pair] : outputs) {
          const double e = worst_error(pair.second->host(), *pair.first, kRtol, kAtol);
          t.expect(e <= 1.0, where + ": " + name + " matches the CPU (worst " + std::to_string(e) + ")");
        }
        if (variant.config.prediction != SAPIPE_PREDICTION_NONE) {
          std::vector<uint16_t> got(n);
          cuda->copy_to_host(got.data(), bf16 + offset, n * sizeof(uint16_t), nullptr);
          cuda->stream_synchronize(nullptr);
          const std::vector<float> wh = dev.predicted.host();
          bool same = true;
          for (size_t i = 0; i < n; ++i) {
            const uint32_t bits = static_cast<uint32_t>(got[i]) << 16;
            float x;
            std::memcpy(&x, &bits, 4);
            same = same && x == bf16_round(wh[offset + i]);
          }
          t.expect(same, where + ": the bf16 copy is w_hat rounded to nearest even");
        }
        cuda->free_device(bf16);
      }
    }
  }
}

void check_guard(Checks& t, const sapipe_cuda_plugin_v1* cuda) {
  for (const Variant& variant : update_variants()) {
    HostState host;
    host.fill(100003, 5);
    const bool reads_local = variant.config.prediction == SAPIPE_PREDICTION_SHADOW_STEP &&
                             variant.config.estimate != SAPIPE_ESTIMATE_PREV_SYNC;
    (reads_local ? host.local : host.g)[99999] = NAN;  // in the last block, far from the first
    DeviceState dev(cuda, host);
    sapipe_update_buffers b = dev.buffers(0, 100003);
    sapipe_update_result r{};
    const sapipe_status s = cuda->update(&variant.config, &b, nullptr, &r, nullptr);
    t.expect(s == SAPIPE_OK && r.applied == 0 && r.non_finite_count == 1, variant.name + ": the guard skips the step");
    t.expect(dev.w.host() == host.w && dev.m.host() == host.m && dev.v.host() == host.v &&
                 dev.backup.host() == host.backup && dev.predicted.host() == host.predicted &&
                 dev.prev_local.host() == host.prev_local,
             variant.name + ": a skipped step writes nothing on the device");
  }
}

void check_helpers(Checks& t, const sapipe_cuda_plugin_v1* cuda) {
  double* dnorm = nullptr;
  int64_t* dcount = nullptr;
  cuda->malloc_device(reinterpret_cast<void**>(&dnorm), sizeof(double));
  cuda->malloc_device(reinterpret_cast<void**>(&dcount), sizeof(int64_t));
  auto read_count = [&] {
    int64_t c = -1;
    cuda->copy_to_host(&c, dcount, sizeof c, nullptr);
    cuda->stream_synchronize(nullptr);
    return c;
  };
  for (size_t n : {size_t{1}, size_t{7}, size_t{4099}, (size_t{1} << 22) + 1}) {
    HostState h;
    h.fill(n, static_cast<unsigned>(n) + 99);
    const std::string at = " n=" + std::to_string(n);
    for (size_t k : {size_t{1}, size_t{2}, size_t{9}, size_t{17}}) {
      std::vector<std::vector<float>> in(k, h.g);
      for (size_t j = 0; j < k; ++j)
        for (size_t i = 0; i < n; ++i) in[j][i] += static_cast<float>(j) * 0.125f;
      if (k > 1) in[k - 1][n - 1] = NAN;
      std::vector<const float*> hp, dp;
      std::vector<DeviceVector*> dv;
      for (auto& x : in) {
        hp.push_back(x.data());
        dv.push_back(new DeviceVector(cuda, x));
        dp.push_back(dv.back()->ptr);
      }
      std::vector<float> out(n);
      DeviceVector dout(cuda, out);
      int64_t hbad = 0;
      sapipe_cpu_sum(out.data(), hp.data(), k, n, 0.5f, &hbad);
      const bool ok = cuda->sum(dout.ptr, dp.data(), k, n, 0.5f, dcount, nullptr) == SAPIPE_OK;
      const int64_t dbad = read_count();
      std::vector<float> got = dout.host();
      for (size_t i = 0; i < n; ++i) if (!std::isfinite(out[i])) out[i] = got[i] = 0;
      t.expect(ok && dbad == hbad && worst_error(got, out, 1e-6, 1e-7) <= 1.0,
               "sum of " + std::to_string(k) + " with its non-finite count" + at);
      for (auto* d : dv) delete d;
    }
    {
      std::vector<float> x = h.w;
      DeviceVector dx(cuda, x);
      sapipe_cpu_scale(x.data(), n, 1.5f);
      cuda->scale(dx.ptr, n, 1.5f, nullptr);
      t.expect(dx.host() == x, "scale" + at);
    }
    {
      std::vector<float> y = h.m;
      DeviceVector dy(cuda, y), dx(cuda, h.w);
      sapipe_cpu_axpy(y.data(), h.w.data(), n, -0.75f);
      cuda->axpy(dy.ptr, dx.ptr, n, -0.75f, nullptr);
      t.expect(worst_error(dy.host(), y, 1e-6, 1e-7) <= 1.0, "axpy" + at);
    }
    {
      DeviceVector dx(cuda, h.w);
      double want = 0, got = 0;
      sapipe_cpu_squared_norm(h.w.data(), n, &want);
      cuda->squared_norm(dx.ptr, n, dnorm, nullptr);
      cuda->copy_to_host(&got, dnorm, sizeof got, nullptr);
      cuda->stream_synchronize(nullptr);
      t.expect(std::fabs(got - want) <= 1e-6 * want, "squared norm" + at);
    }
    {
      std::vector<float> x = h.g;
      x[0] = NAN, x[n - 1] = INFINITY;
      DeviceVector dx(cuda, x);
      cuda->count_non_finite(dx.ptr, n, dcount, nullptr);
      t.expect(read_count() == (n > 1 ? 2 : 1), "count non-finite" + at);
    }
    {
      std::vector<float> w = h.w, c = h.backup;
      DeviceVector dw(cuda, w), dc(cuda, c);
      sapipe_cpu_elastic_average(w.data(), c.data(), n, 0.225f);
      cuda->elastic_average(dw.ptr, dc.ptr, n, 0.225f, nullptr);
      t.expect(worst_error(dw.host(), w, 1e-6, 1e-7) <= 1.0 && worst_error(dc.host(), c, 1e-6, 1e-7) <= 1.0,
               "elastic average" + at);
    }
  }
  cuda->free_device(dnorm);
  cuda->free_device(dcount);
}

// MSTopK on the device against the CPU kernels: exactly k, indices ascending, the values of
// x = g + r at them, the residual zeroed there and x elsewhere, and recall against the exact top-k
// at least 1 - 1/64 (the search's stopping rule), on Gaussian and heavy-tailed data at densities
// 0.001, 0.01, 0.05. Then the scatter-add of three ranks' selections in order, against the CPU's,
// with an out-of-range index skipped and counted.
void check_topk(Checks& t, const sapipe_cuda_plugin_v1* cuda) {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto uniform = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (static_cast<double>(state >> 11) + 0.5) / 9007199254740992.0;
  };
  auto normal = [&] { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); };
  int64_t* dbad = nullptr;
  cuda->malloc_device(reinterpret_cast<void**>(&dbad), sizeof(int64_t));
  for (size_t n : {size_t{1}, size_t{4099}, (size_t{1} << 20) + 3, size_t{1} << 24})
    for (int heavy = 0; heavy < 2; ++heavy)
      for (double density : {0.001, 0.01, 0.05}) {
        const size_t k = std::max<size_t>(1, static_cast<size_t>(std::llround(density * static_cast<double>(n))));
        std::vector<float> g(n), r(n), x(n);
        for (size_t i = 0; i < n; ++i) {
          // heavy: a Student-t with 2 degrees of freedom (infinite variance).
          g[i] = static_cast<float>(heavy ? normal() / std::sqrt(-std::log(uniform())) : normal());
          r[i] = static_cast<float>(0.1 * normal());
          x[i] = g[i] + r[i];
        }
        const std::string at = " n=" + std::to_string(n) + (heavy ? " heavy-tailed" : " gaussian") + " density=" + std::to_string(density);
        DeviceVector dg(cuda, g), dr(cuda, r);
        int32_t* didx = nullptr;
        float* dval = nullptr;
        cuda->malloc_device(reinterpret_cast<void**>(&didx), k * sizeof(int32_t));
        cuda->malloc_device(reinterpret_cast<void**>(&dval), k * sizeof(float));
        sapipe_topk_stats stats{};
        const bool ok = cuda->topk_select(dg.ptr, dr.ptr, n, k, 8, didx, dval, &stats, nullptr) == SAPIPE_OK;
        std::vector<int32_t> idx(k);
        std::vector<float> val(k);
        cuda->copy_to_host(idx.data(), didx, k * sizeof(int32_t), nullptr);
        cuda->copy_to_host(val.data(), dval, k * sizeof(float), nullptr);
        cuda->stream_synchronize(nullptr);
        std::vector<float> res = dr.host();
        bool ascending = true, values = true, residual = true;
        std::vector<char> taken(n, 0);
        for (size_t i = 0; i < k; ++i) {
          const int32_t j = idx[i];
          ascending = ascending && j >= 0 && static_cast<size_t>(j) < n && (i == 0 || j > idx[i - 1]);
          if (!ascending) break;
          taken[static_cast<size_t>(j)] = 1;
          values = values && val[i] == x[static_cast<size_t>(j)];
        }
        for (size_t i = 0; ascending && i < n; ++i) residual = residual && res[i] == (taken[i] ? 0.0f : x[i]);
        std::vector<int32_t> exact(k);
        std::vector<float> exact_values(k);
        sapipe_cpu_topk_exact(x.data(), n, k, exact.data(), exact_values.data());
        size_t hits = 0;
        for (int32_t j : exact) hits += ascending && taken[static_cast<size_t>(j)] ? 1 : 0;
        const double recall = static_cast<double>(hits) / static_cast<double>(k);
        t.expect(ok && ascending, "topk select: exactly k ascending indices" + at);
        t.expect(values && residual, "topk select: the values of x and the residual zeroed at them" + at);
        t.expect(recall >= 1.0 - 1.0 / 64.0, "topk select: recall " + std::to_string(recall) + " against the exact top-k" + at);
        cuda->free_device(didx);
        cuda->free_device(dval);
      }
  {
    // Three ranks' pairs, applied in rank order, on device and host.
    const size_t n = 10007, k = 300;
    std::vector<float> host_out(n, 0.0f);
    DeviceVector dout(cuda, host_out);
    int64_t zero = 0;
    cuda->copy_to_device(dbad, &zero, sizeof zero, nullptr);
    for (int rank = 0; rank < 3; ++rank) {
      std::vector<int32_t> idx(k);
      std::vector<float> val(k);
      for (size_t i = 0; i < k; ++i) {
        idx[i] = static_cast<int32_t>((i * 31 + static_cast<size_t>(rank) * 7) % n);
        val[i] = static_cast<float>(normal());
      }
      if (rank == 2) idx[k - 1] = static_cast<int32_t>(n);  // out of range: skipped, counted
      int32_t* didx = nullptr;
      float* dval = nullptr;
      cuda->malloc_device(reinterpret_cast<void**>(&didx), k * sizeof(int32_t));
      cuda->malloc_device(reinterpret_cast<void**>(&dval), k * sizeof(float));
      cuda->copy_to_device(didx, idx.data(), k * sizeof(int32_t), nullptr);
      cuda->copy_to_device(dval, val.data(), k * sizeof(float), nullptr);
      t.expect(cuda->scatter_add(dout.ptr, n, didx, dval, k, 1.0f / 3.0f, dbad, nullptr) == SAPIPE_OK, "scatter add: rank " + std::to_string(rank));
      sapipe_cpu_scatter_add(host_out.data(), n, idx.data(), val.data(), rank == 2 ? k - 1 : k, 1.0f / 3.0f);
      cuda->stream_synchronize(nullptr);
      cuda->free_device(didx);
      cuda->free_device(dval);
    }
    int64_t bad = -1;
    cuda->copy_to_host(&bad, dbad, sizeof bad, nullptr);
    cuda->stream_synchronize(nullptr);
    t.expect(worst_error(dout.host(), host_out, 1e-6, 1e-7) <= 1.0, "scatter add: three ranks in order equal the CPU's");
    t.expect(bad == 1, "scatter add: the out-of-range index skipped and counted");
  }
  cuda->free_device(dbad);
}

// A one-rank NCCL communicator: with one rank every collective is a copy and the fused steps are
// the plain update (grad_scale folds 1/size = 1), so they are checked against the CPU update.
void check_nccl(Checks& t, const sapipe_cuda_plugin_v1* cuda) {
  if (cuda->header.table_size < sizeof(sapipe_cuda_plugin_v1)) {
    t.expect(false, "the plugin has the appended NCCL entries");
    return;
  }
  int32_t version = 0;
  const char* path = nullptr;
  if (cuda->nccl_probe(&version, &path) != SAPIPE_OK) {
    std::printf("# skip NCCL checks: %s\n", cuda->last_error());
    return;
  }
  std::printf("# NCCL %d at %s\n", version, path);
  uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES] = {};
  void* comm = nullptr;
  const bool up = cuda->nccl_get_unique_id(id) == SAPIPE_OK && cuda->nccl_comm_init_rank(&comm, 1, id, 0) == SAPIPE_OK;
  t.expect(up, std::string("nccl: unique id and a one-rank communicator (") + cuda->last_error() + ")");
  if (!up) return;
  void *cs = nullptr, *xs = nullptr;
  cuda->stream_create(&cs);
  cuda->stream_create(&xs);
  auto finish = [&](void* s) {
    int32_t done = 0;
    for (int i = 0; i < 1000000 && done == 0; ++i)
      if (cuda->stream_query(s, &done) != SAPIPE_OK) return false;
    return done == 1;
  };
  int32_t async_error = -1;
  t.expect(cuda->nccl_comm_async_error(comm, &async_error) == SAPIPE_OK && async_error == 0, "nccl: no async error");
  {
    std::vector<float> x = {1, 2, 3, 4, 5};
    DeviceVector dx(cuda, x), dy(cuda, std::vector<float>(5, 0));
    bool ok = cuda->nccl_all_reduce(comm, dx.ptr, dx.ptr, 5, SAPIPE_NCCL_SUM, cs) == SAPIPE_OK && finish(cs);
    ok = ok && cuda->nccl_all_gather(comm, dx.ptr, dy.ptr, 5, cs) == SAPIPE_OK && finish(cs) && dy.host() == x;
    ok = ok && cuda->nccl_reduce_scatter(comm, dx.ptr, dy.ptr, 5, SAPIPE_NCCL_AVG, cs) == SAPIPE_OK && finish(cs) && dy.host() == x;
    ok = ok && cuda->nccl_broadcast(comm, dx.ptr, dx.ptr, 5, 0, cs) == SAPIPE_OK && finish(cs) && dx.host() == x;
    t.expect(ok, "nccl: one-rank all-reduce, all-gather, reduce-scatter, broadcast are copies");
    t.expect(cuda->nccl_broadcast(comm, dx.ptr, dx.ptr, 5, 1, cs) == SAPIPE_ERR_INVALID_ARGUMENT, "nccl: a root that is no rank is refused");
    t.expect(cuda->nccl_send(comm, dx.ptr, 5, 0, cs) == SAPIPE_ERR_INVALID_ARGUMENT, "nccl: sending to oneself is refused");
  }
  for (const Variant& variant : update_variants()) {
    if (variant.config.prediction == SAPIPE_PREDICTION_SHADOW_STEP && variant.config.estimate != SAPIPE_ESTIMATE_PREV_SYNC) continue;
    for (int sharded = 0; sharded <= 1; ++sharded) {
      const size_t n = 4099 * 16;
      HostState host;
      host.fill(n, 11);
      DeviceState dev(cuda, host);
      const size_t buckets[] = {1024, 16384, n - 1024 - 16384};
      sapipe_update_config c = variant.config;
      c.grad_checked = 1;
      sapipe_update_buffers hb = host.buffers(0, n), db = dev.buffers(0, n);
      sapipe_update_result hr{};
      sapipe_nccl_step_result dr{};
      const bool cpu_ok = sapipe_cpu_update(&c, &hb, &hr) == SAPIPE_OK;
      const bool ok = cuda->nccl_fused_update(comm, &c, &db, buckets, 3, sharded, cs, xs) == SAPIPE_OK && finish(cs) && finish(xs) &&
                      cuda->nccl_fused_update_result(comm, &dr) == SAPIPE_OK && dr.applied == 1;
      const std::string where = variant.name + (sharded ? " sharded" : " replicated");
      t.expect(cpu_ok && ok, "nccl fused step " + where + ": applied (" + cuda->last_error() + ")");
      t.expect(worst_error(dev.w.host(), host.w, kRtol, kAtol) <= 1.0 && worst_error(dev.predicted.host(), host.predicted, kRtol, kAtol) <= 1.0,
               "nccl fused step " + where + ": weights and predicted weights match the CPU update");
    }
  }
  for (const Variant& variant : update_variants()) {
    // Out of place (weights_in), as the staleness-1 trainer steps over nccl: the same step as in
    // place, bit for bit, with the input weights only read and stale contents in the outputs.
    if (variant.config.prediction == SAPIPE_PREDICTION_SHADOW_STEP && variant.config.estimate != SAPIPE_ESTIMATE_PREV_SYNC) continue;
    const size_t n = 4099 * 16;
    HostState host;
    host.fill(n, 13);
    DeviceState in_place(cuda, host), out(cuda, host);
    DeviceVector out_w(cuda, std::vector<float>(n, 123.0f)), out_predicted(cuda, std::vector<float>(n, -7.0f));
    const size_t buckets[] = {1024, 16384, n - 1024 - 16384};
    sapipe_update_config c = variant.config;
    c.grad_checked = 0;
    sapipe_update_buffers a = in_place.buffers(0, n), b = out.buffers(0, n);
    b.weights_in = out.w.ptr;
    b.weights = out_w.ptr, b.predicted = out_predicted.ptr;
    sapipe_nccl_step_result ra{}, rb{};
    const bool ok = cuda->nccl_fused_update(comm, &c, &a, buckets, 3, 0, cs, xs) == SAPIPE_OK && finish(cs) && finish(xs) &&
                    cuda->nccl_fused_update_result(comm, &ra) == SAPIPE_OK &&
                    cuda->nccl_fused_update(comm, &c, &b, buckets, 3, 0, cs, xs) == SAPIPE_OK && finish(cs) && finish(xs) &&
                    cuda->nccl_fused_update_result(comm, &rb) == SAPIPE_OK && ra.applied == 1 && rb.applied == 1;
    const std::string where = "nccl fused step out of place " + variant.name;
    t.expect(ok, where + ": applied (" + cuda->last_error() + ")");
    // Without prediction nothing writes the predicted weights: only the predicting variants compare them.
    const bool predicts = variant.config.prediction != SAPIPE_PREDICTION_NONE;
    t.expect(out_w.host() == in_place.w.host() && (!predicts || out_predicted.host() == in_place.predicted.host()) && out.m.host() == in_place.m.host() &&
                 out.v.host() == in_place.v.host() && out.backup.host() == in_place.backup.host(),
             where + ": equals the in-place step bit for bit");
    t.expect(out.w.host() == host.w, where + ": the input weights are only read");
  }
  const bool has_after = cuda->header.table_size >= offsetof(sapipe_cuda_plugin_v1, nccl_fused_update_after) + sizeof(void*);
  t.expect(has_after, "the plugin has nccl_fused_update_after");
  for (const Variant& variant : update_variants()) {
    // Behind a backward pass: each bucket's gradient is written on the legacy default stream (a
    // copy standing in for the model's operations), last bucket first, and its event recorded
    // there; the step waits for each event on the GPU and equals nccl_fused_update bit for bit.
    if (!has_after) break;
    if (variant.config.prediction == SAPIPE_PREDICTION_SHADOW_STEP && variant.config.estimate != SAPIPE_ESTIMATE_PREV_SYNC) continue;
    const size_t n = 4099 * 16;
    HostState host;
    host.fill(n, 17);
    DeviceState waited(cuda, host), behind(cuda, host);
    DeviceVector staged(cuda, host.g);
    const size_t buckets[] = {1024, 16384, n - 1024 - 16384};
    void* ready[3] = {};
    bool ok = true;
    for (void*& e : ready) ok = ok && cuda->event_create(&e) == SAPIPE_OK;
    ok = ok && cuda->zero(behind.g.ptr, n, nullptr) == SAPIPE_OK;
    for (size_t k = 3, end = n; ok && k-- > 0;) {
      end -= buckets[k];
      ok = cuda->copy_on_device(behind.g.ptr + end, staged.ptr + end, buckets[k] * sizeof(float), nullptr) == SAPIPE_OK &&
           cuda->event_record(ready[k], nullptr) == SAPIPE_OK;
    }
    sapipe_update_config c = variant.config;
    c.grad_checked = 0;
    sapipe_update_buffers a = waited.buffers(0, n), b = behind.buffers(0, n);
    sapipe_nccl_step_result ra{}, rb{};
    ok = ok && cuda->nccl_fused_update_after(comm, &c, &b, buckets, ready, 3, cs, xs) == SAPIPE_OK && finish(cs) && finish(xs) &&
         cuda->nccl_fused_update_result(comm, &rb) == SAPIPE_OK && cuda->stream_synchronize(nullptr) == SAPIPE_OK &&
         cuda->nccl_fused_update(comm, &c, &a, buckets, 3, 0, cs, xs) == SAPIPE_OK && finish(cs) && finish(xs) &&
         cuda->nccl_fused_update_result(comm, &ra) == SAPIPE_OK && ra.applied == 1 && rb.applied == 1;
    const std::string where = "nccl fused step after events " + variant.name;
    t.expect(ok, where + ": applied (" + cuda->last_error() + ")");
    t.expect(behind.w.host() == waited.w.host() && behind.predicted.host() == waited.predicted.host() && behind.m.host() == waited.m.host() &&
                 behind.v.host() == waited.v.host() && behind.backup.host() == waited.backup.host(),
             where + ": equals the step after the whole gradient bit for bit");
    void* missing[3] = {ready[0], nullptr, ready[2]};
    t.expect(cuda->nccl_fused_update_after(comm, &c, &b, buckets, missing, 3, cs, xs) == SAPIPE_ERR_INVALID_ARGUMENT,
             where + ": a bucket without an event is refused");
    for (void* e : ready) cuda->event_destroy(e);
  }
  {
    // Finite gradients whose sum could overflow: the step is skipped with overflow_risk, and the
    // recheck (on the already reduced gradient, finite here) applies it.
    const size_t n = 4096;
    HostState host;
    host.fill(n, 5);
    for (float& g : host.g) g = 3e38f;
    DeviceState dev(cuda, host);
    sapipe_update_config c = update_variants().front().config;
    sapipe_update_buffers db = dev.buffers(0, n);
    const size_t all[] = {n};
    sapipe_nccl_step_result first{}, second{};
    bool ok = cuda->nccl_fused_update(comm, &c, &db, all, 1, 0, cs, xs) == SAPIPE_OK && finish(cs) && finish(xs) &&
              cuda->nccl_fused_update_result(comm, &first) == SAPIPE_OK;
    t.expect(ok && first.applied == 0 && first.overflow_risk == 1 && first.non_finite_count == 0, "nccl: an overflow risk skips with overflow_risk");
    ok = cuda->nccl_fused_update_recheck(comm, &c, &db, 0, cs, xs) == SAPIPE_OK && finish(cs) && finish(xs) &&
         cuda->nccl_fused_update_result(comm, &second) == SAPIPE_OK;
    t.expect(ok && second.applied == 1 && second.non_finite_count == 0, "nccl: the recheck applies a finite reduced gradient");
    host.g[7] = NAN;
    DeviceState bad(cuda, host);
    sapipe_update_buffers bb = bad.buffers(0, n);
    ok = cuda->nccl_fused_update(comm, &c, &bb, all, 1, 1, cs, xs) == SAPIPE_OK && finish(cs) && finish(xs) &&
         cuda->nccl_fused_update_result(comm, &first) == SAPIPE_OK;
    t.expect(ok && first.applied == 0 && first.non_finite_count == 1 && bad.w.host() == host.w, "nccl: a NaN skips the sharded step and writes nothing");
  }
  cuda->stream_destroy(cs);
  cuda->stream_destroy(xs);
  t.expect(cuda->nccl_comm_destroy(comm) == SAPIPE_OK, "nccl: destroy");
}

}  // namespace

int main(int argc, char** argv) {
  const int device = argc > 1 ? std::atoi(argv[1]) : 0;
  const sapipe_cuda_plugin_v1* cuda = open_cuda(device);
  if (cuda == nullptr) return 2;
  Checks t;
  check_updates(t, cuda);
  check_guard(t, cuda);
  check_helpers(t, cuda);
  check_topk(t, cuda);
  check_nccl(t, cuda);
  return t.finish("sapipe_cuda_check");
}
