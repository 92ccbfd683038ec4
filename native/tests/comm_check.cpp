#include "comm_check.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../comm/local/local_ops.h"
#include "../comm/local/local_registry.h"
#include "../comm/nccl/nccl_ops.h"
#include "../core/plugin_loader.h"
#include "variants.h"

namespace sapipe::tests {
namespace {

using namespace std::chrono_literals;
using comm::CollectiveArgs;
using comm::CollectiveKind;
using comm::local::Group;

struct RankResult {
  sapipe_status status = SAPIPE_ERR_INTERNAL;
  int64_t non_finite = -1;
  std::string detail;
  std::vector<float> data;
};

// Runs body(group, rank, result) on `size` threads, each a rank of a fresh group called `name`.
std::vector<RankResult> on_ranks(const std::string& name, int size,
                                 const std::function<void(const std::shared_ptr<Group>&, int, RankResult&)>& body) {
  std::vector<RankResult> results(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      std::shared_ptr<Group> group;
      RankResult& out = results[static_cast<size_t>(r)];
      out.status = comm::local::join_group(name, size, r, &group, &out.detail);
      if (out.status == SAPIPE_OK) out.status = group->wait_ready(r, comm::Clock::now() + 10s, &out.detail);
      if (out.status == SAPIPE_OK) body(group, r, out);
      if (group) group->leave(r, false);
    });
  for (auto& th : threads) th.join();
  return results;
}

// Every rank all-reduces [r + 1, r + 1, ...] (n elements, one NaN on rank 1 at `nan_at` if set).
std::vector<RankResult> allreduce(const std::string& name, int size, bool ring, const std::vector<size_t>& counts, long nan_at = -1) {
  return on_ranks(name, size, [&](const std::shared_ptr<Group>& group, int r, RankResult& out) {
    out.data.assign(counts[static_cast<size_t>(r)], static_cast<float>(r + 1));
    if (r == 1 && nan_at >= 0) out.data[static_cast<size_t>(nan_at)] = NAN;
    CollectiveArgs a;
    a.kind = CollectiveKind::kAllreduce;
    a.input = out.data.data();
    a.input_count = out.data.size();
    a.scale = 0.5f;
    out.status = comm::local::run_collective(group, r, a, ring, comm::Clock::now() + 10s, &out.non_finite, &out.detail);
  });
}

}  // namespace

void check_local_ops(Checks& t) {
  for (bool ring : {false, true}) {
    const std::string how = ring ? "by the ring" : "by the group";
    const size_t n = 1001;
    auto results = allreduce("cpu-check-allreduce-" + std::to_string(ring), 3, ring, {n, n, n});
    bool ok = true;
    for (const RankResult& r : results) {
      ok = ok && r.status == SAPIPE_OK && r.non_finite == 0;
      for (float x : r.data) ok = ok && x == 3.0f;  // (1 + 2 + 3) * 0.5
    }
    t.expect(ok, "a local all-reduce " + how + " sums every rank's buffer on every rank");
    results = allreduce("cpu-check-nan-" + std::to_string(ring), 3, ring, {n, n, n}, 17);
    ok = true;
    for (const RankResult& r : results) ok = ok && r.status == SAPIPE_OK && r.non_finite == 1 && std::isnan(r.data[17]);
    t.expect(ok, "a local all-reduce " + how + " counts the non-finite sums on every rank");
    results = allreduce("cpu-check-mismatch-" + std::to_string(ring), 2, ring, {n, n + 1});
    t.expect(results[0].status == SAPIPE_ERR_SIZE_MISMATCH && results[1].status == SAPIPE_ERR_SIZE_MISMATCH,
             "ranks that pass different sizes to an all-reduce " + how + " all fail alike: " + results[0].detail);
  }
  {
    auto results = on_ranks("cpu-check-ring-kind", 1, [](const std::shared_ptr<Group>& group, int r, RankResult& out) {
      std::vector<float> x(4, 1.0f);
      CollectiveArgs a;
      a.kind = CollectiveKind::kBroadcast;
      a.input = x.data();
      a.input_count = x.size();
      out.status = comm::local::run_collective(group, r, a, true, comm::Clock::now() + 1s, &out.non_finite, &out.detail);
    });
    t.expect(results[0].status == SAPIPE_ERR_INVALID_ARGUMENT, "the ring is offered for an all-reduce only");
  }
  {
    auto results = on_ranks("cpu-check-p2p", 2, [](const std::shared_ptr<Group>& group, int r, RankResult& out) {
      out.data.assign(5, r == 0 ? 7.0f : 0.0f);
      const comm::Deadline d = comm::Clock::now() + 10s;
      out.status = r == 0 ? comm::local::send_to_peer(*group, 0, 1, out.data.data(), out.data.size(), d, &out.detail)
                          : comm::local::recv_from_peer(*group, 1, 0, out.data.data(), out.data.size(), d, &out.detail);
    });
    t.expect(results[0].status == SAPIPE_OK && results[1].status == SAPIPE_OK && results[1].data == std::vector<float>(5, 7.0f),
             "a local send is received by its peer");
  }
  {
    // The fused steps' job: checked, refused where it cannot run, planned.
    std::vector<Variant> variants = update_variants();
    auto named = [&](const std::string& name) {
      for (const Variant& v : variants)
        if (v.name == name) return v.config;
      return variants[0].config;
    };
    HostState s;
    s.fill(64, 9);
    sapipe_update_buffers b = s.buffers(8, 40);
    b.local_grad = nullptr;
    b.prev_local_grad = nullptr;
    b.backup = nullptr;
    b.predicted = nullptr;
    b.second_moment = nullptr;
    b.momentum = nullptr;
    comm::ReduceUpdateJob job;
    CollectiveArgs args;
    std::string detail;
    sapipe_status st = comm::local::prepare_update_job(CollectiveKind::kReduceUpdate, named("sgd"), b, &job, &args, &detail);
    t.expect(st == SAPIPE_OK && args.kind == CollectiveKind::kReduceUpdate && args.job == &job && args.input == s.g.data() + 8 &&
                 args.input_count == 40 && !job.plan.stream_predicted,
             "a sharded step's job carries the gradient's range and never streams its predicted weights: " + detail);
    st = comm::local::prepare_update_job(CollectiveKind::kUpdateFromParts, named("sgd"), b, &job, &args, &detail);
    t.expect(st == SAPIPE_OK && args.kind == CollectiveKind::kUpdateFromParts, "a replicated step's second pass has a job: " + detail);
    sapipe_update_buffers local = s.buffers(0, 64);
    local.backup = nullptr;
    local.second_moment = nullptr;
    local.prev_local_grad = nullptr;
    detail.clear();
    st = comm::local::prepare_update_job(CollectiveKind::kReduceUpdate, named("sgd-momentum+wp-local"), local, &job, &args, &detail);
    t.expect(st == SAPIPE_ERR_INVALID_ARGUMENT && detail.find("cannot be sharded") != std::string::npos,
             "a sharded step refuses a prediction that reads each rank's own gradient: " + detail);
    sapipe_update_buffers out_of_place = b;
    out_of_place.weights_in = s.backup.data();
    detail.clear();
    st = comm::local::prepare_update_job(CollectiveKind::kUpdateFromParts, named("sgd"), out_of_place, &job, &args, &detail);
    t.expect(st == SAPIPE_ERR_INVALID_ARGUMENT && detail.find("in place") != std::string::npos, "a fused step refuses weightsIn: " + detail);
    sapipe_update_config bad = named("sgd");
    bad.lr = -1;
    detail.clear();
    st = comm::local::prepare_update_job(CollectiveKind::kUpdateFromParts, bad, b, &job, &args, &detail);
    t.expect(st == SAPIPE_ERR_INVALID_ARGUMENT && detail.empty(), "an invalid configuration is refused as the kernels refuse it");
  }
}

void check_nccl_ops(Checks& t, const std::string& fakes) {
  namespace nccl = comm::nccl;
  const std::string path = fakes + "/sapipe_test_plugin_host_memory.so";
  PluginLoad load = load_plugin(path, "cuda", SAPIPE_CUDA_PLUGIN_ABI_VERSION, sizeof(sapipe_cuda_plugin_v1));
  t.expect(load.table != nullptr, "the host-memory CUDA plugin loads: " + load.reason);
  if (load.table == nullptr) return;
  const auto* cuda = reinterpret_cast<const sapipe_cuda_plugin_v1*>(load.table);
  auto make_state = [&](int32_t size) {
    auto st = std::make_shared<nccl::NcclState>();
    st->cuda = cuda;
    st->device = 0, st->size = size, st->rank = 0, st->timeout_ms = 5000;
    return st;
  };
  uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES];
  cuda->nccl_get_unique_id(id);

  auto st = make_state(1);
  nccl::Outcome out = nccl::run_collective(*st, {}, nccl::operation_deadline(*st), nullptr);
  t.expect(out.status == SAPIPE_ERR_PEER_LOST && out.message.find("not initialised") != std::string::npos,
           "an NCCL collective before init fails, naming why: " + out.message);
  out = nccl::init_communicator(*st, id);
  t.expect(out.status == SAPIPE_OK && st->comm != nullptr && st->comm_stream != nullptr && st->compute_stream != nullptr,
           "an NCCL communicator initialises with its streams: " + out.message);

  const size_t n = 37;
  float* device = nullptr;
  cuda->malloc_device(reinterpret_cast<void**>(&device), n * sizeof(float));
  std::vector<float> host(n, 2.0f);
  host[5] = NAN;
  out = nccl::stage_copy(*st, device, host.data(), n, true, nccl::operation_deadline(*st));
  t.expect(out.status == SAPIPE_OK, "staging a host buffer to the device runs in order: " + out.message);
  nccl::NcclCollective c;
  c.kind = nccl::kNcclAllReduce;
  c.a = device;
  c.count = n;
  int64_t non_finite = -1;
  out = nccl::run_collective(*st, c, nccl::operation_deadline(*st), &non_finite);
  t.expect(out.status == SAPIPE_OK && non_finite == 1, "an NCCL all-reduce counts the non-finite elements of its result: " + out.message);
  c.kind = nccl::kNcclSend;
  c.arg = 3;
  out = nccl::run_collective(*st, c, nccl::operation_deadline(*st), &non_finite);
  t.expect(out.status == SAPIPE_ERR_INVALID_ARGUMENT && out.message.rfind("send: ", 0) == 0,
           "a refused NCCL call names the operation and the plugin's reason: " + out.message);

  // The fused step over one rank: a finite gradient is applied, a non-finite one skipped.
  const sapipe_update_config sgd = update_variants()[0].config;
  std::vector<float*> memory;
  auto on_device = [&](const std::vector<float>& values) {
    float* p = nullptr;
    cuda->malloc_device(reinterpret_cast<void**>(&p), values.size() * sizeof(float));
    cuda->copy_to_device(p, values.data(), values.size() * sizeof(float), nullptr);
    memory.push_back(p);
    return p;
  };
  nccl::FusedStep step;
  step.config = sgd;
  step.buffers.count = n;
  step.buffers.weights = on_device(std::vector<float>(n, 1.0f));
  step.buffers.grad = on_device(std::vector<float>(n, 0.5f));
  step.buckets = {20, 17};
  sapipe_nccl_step_result result{};
  out = nccl::run_fused_step(*st, step, nccl::operation_deadline(*st), &result);
  std::vector<float> w(n);
  cuda->copy_to_host(w.data(), step.buffers.weights, n * sizeof(float), nullptr);
  t.expect(out.status == SAPIPE_OK && result.applied == 1 && w[0] < 1.0f && w[n - 1] == w[0],
           "an NCCL fused step over its buckets updates the weights: " + out.message);
  step.buffers.grad = device;  // holds a NaN
  out = nccl::run_fused_step(*st, step, nccl::operation_deadline(*st), &result);
  t.expect(out.status == SAPIPE_OK && result.applied == 0 && result.non_finite_count == 1, "an NCCL fused step skips a non-finite gradient");

  // destroy() while idle aborts at once; every later operation fails with ERR_DISPOSED.
  nccl::request_destroy(*st);
  c.kind = nccl::kNcclAllReduce;
  out = nccl::run_collective(*st, c, nccl::operation_deadline(*st), &non_finite);
  t.expect(st->comm == nullptr && st->comm_stream == nullptr && out.status == SAPIPE_ERR_DISPOSED,
           "after destroy() the communicator is aborted and operations fail: " + out.message);
  // destroy() with an operation in flight leaves the abort to that operation.
  auto busy = make_state(1);
  nccl::init_communicator(*busy, id);
  busy->in_flight.store(1);
  nccl::request_destroy(*busy);
  const bool deferred = busy->comm != nullptr;
  nccl::finish_operation(*busy);
  busy->in_flight.store(0);
  t.expect(deferred && busy->comm == nullptr && busy->broken == "destroyed", "destroy() in flight is finished by the operation");

  // An id this plugin did not make fails at once (a live one would wait for the other rank).
  auto two = make_state(2);
  uint8_t foreign[SAPIPE_NCCL_UNIQUE_ID_BYTES] = {};
  out = nccl::init_communicator(*two, foreign);
  t.expect(out.status != SAPIPE_OK && out.message.rfind("ncclCommInitRank: ", 0) == 0 && two->comm_stream == nullptr,
           "a failed NCCL init names the call and frees the streams: " + out.message);
  for (float* p : memory) cuda->free_device(p);
  cuda->free_device(device);

  // Two ranks as threads of this process (the emulation joins them over Unix sockets): an
  // all-reduce, a send matched by its recv, and a rank that aborts failing the other at once.
  uint8_t pair[SAPIPE_NCCL_UNIQUE_ID_BYTES];
  cuda->nccl_get_unique_id(pair);
  std::vector<float> values[2] = {std::vector<float>(n, 1.0f), std::vector<float>(n, 2.0f)};
  nccl::Outcome results[2][4];
  auto rank = [&](int32_t r) {
    auto mine = make_state(2);
    mine->rank = r;
    nccl::Outcome* res = results[r];
    res[0] = nccl::init_communicator(*mine, pair);
    if (res[0].status != SAPIPE_OK) return;
    float* x = nullptr;
    cuda->malloc_device(reinterpret_cast<void**>(&x), n * sizeof(float));
    cuda->copy_to_device(x, values[r].data(), n * sizeof(float), nullptr);
    nccl::NcclCollective op;
    op.kind = nccl::kNcclAllReduce, op.a = x, op.count = n;
    int64_t bad = 0;
    res[1] = nccl::run_collective(*mine, op, nccl::operation_deadline(*mine), &bad);
    op.kind = r == 0 ? nccl::kNcclSend : nccl::kNcclRecv, op.arg = 1 - r, op.count = 1;
    if (r == 0) values[0][0] = 10.0f, cuda->copy_to_device(x, values[0].data(), sizeof(float), nullptr);
    res[2] = nccl::run_collective(*mine, op, nccl::operation_deadline(*mine), &bad);
    cuda->copy_to_host(values[r].data(), x, n * sizeof(float), nullptr);
    if (r == 1) {
      std::lock_guard<std::mutex> lock(mine->mutex);
      mine->release_locked("left");
    } else {
      op.kind = nccl::kNcclAllReduce, op.count = n;
      res[3] = nccl::run_collective(*mine, op, nccl::operation_deadline(*mine), &bad);
    }
    cuda->free_device(x);
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  t.expect(results[0][0].status == SAPIPE_OK && results[1][0].status == SAPIPE_OK,
           "two ranks in threads join one clique: " + results[0][0].message + results[1][0].message);
  t.expect(results[0][1].status == SAPIPE_OK && results[1][1].status == SAPIPE_OK && values[0][n - 1] == 3.0f && values[1][n - 1] == 3.0f,
           "an all-reduce over two ranks sums both: " + results[0][1].message + results[1][1].message);
  t.expect(results[0][2].status == SAPIPE_OK && results[1][2].status == SAPIPE_OK && values[1][0] == 10.0f,
           "a send arrives at the matching recv: " + results[0][2].message + results[1][2].message);
  t.expect(results[0][3].status == SAPIPE_ERR_PEER_LOST, "a rank that aborts fails its peer's collective with ERR_PEER_LOST: " + results[0][3].message);

  // Three ranks through the table itself: every collective, in place where NCCL allows it.
  uint8_t trio[SAPIPE_NCCL_UNIQUE_ID_BYTES];
  cuda->nccl_get_unique_id(trio);
  constexpr int32_t kRanks = 3;
  constexpr size_t kPart = 4;
  bool ok[kRanks] = {};
  std::string why[kRanks];
  auto member = [&](int32_t r) {
    void* comm = nullptr;
    if (cuda->nccl_comm_init_rank(&comm, kRanks, trio, r) != SAPIPE_OK) {
      why[r] = std::string("init: ") + cuda->last_error();
      return;
    }
    std::vector<float> x(kRanks * kPart);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(r + 1) * static_cast<float>(i + 1);
    bool good = cuda->nccl_all_reduce(comm, x.data(), x.data(), x.size(), SAPIPE_NCCL_AVG, nullptr) == SAPIPE_OK;
    // (1 + 2 + 3) / 3 = 2 times (i + 1) on every rank.
    for (size_t i = 0; good && i < x.size(); ++i) good = x[i] == 2.0f * static_cast<float>(i + 1);
    float* own = x.data() + static_cast<size_t>(r) * kPart;
    good = good && cuda->nccl_reduce_scatter(comm, x.data(), own, kPart, SAPIPE_NCCL_SUM, nullptr) == SAPIPE_OK;
    for (size_t i = 0; good && i < kPart; ++i) good = own[i] == 6.0f * static_cast<float>(static_cast<size_t>(r) * kPart + i + 1);
    good = good && cuda->nccl_all_gather(comm, own, x.data(), kPart, nullptr) == SAPIPE_OK;
    for (size_t i = 0; good && i < x.size(); ++i) good = x[i] == 6.0f * static_cast<float>(i + 1);
    float word = static_cast<float>(r);
    good = good && cuda->nccl_broadcast(comm, &word, &word, 1, 2, nullptr) == SAPIPE_OK && word == 2.0f;
    // A ring of sends: each rank sends to the next and receives from the one before.
    float token = static_cast<float>(10 + r);
    float got = 0;
    const int32_t next = (r + 1) % kRanks, before = (r + kRanks - 1) % kRanks;
    if (r == 0)
      good = good && cuda->nccl_send(comm, &token, 1, next, nullptr) == SAPIPE_OK && cuda->nccl_recv(comm, &got, 1, before, nullptr) == SAPIPE_OK;
    else
      good = good && cuda->nccl_recv(comm, &got, 1, before, nullptr) == SAPIPE_OK && cuda->nccl_send(comm, &token, 1, next, nullptr) == SAPIPE_OK;
    good = good && got == static_cast<float>(10 + before);
    if (!good) why[r] = cuda->last_error();
    ok[r] = good;
    cuda->nccl_comm_destroy(comm);
  };
  std::thread second(member, 1), third(member, 2);
  member(0);
  second.join();
  third.join();
  t.expect(ok[0] && ok[1] && ok[2], "three ranks: average, reduce-scatter, all-gather, broadcast and a ring of sends: " + why[0] + why[1] + why[2]);

  // A peer that stays joined but never calls: the collective fails at the bound, and so does every
  // later call (the bound is read when a rank joins).
  setenv("SAPIPE_HOST_NCCL_TIMEOUT_MS", "200", 1);
  uint8_t quiet[SAPIPE_NCCL_UNIQUE_ID_BYTES];
  cuda->nccl_get_unique_id(quiet);
  void* silent = nullptr;
  std::thread joiner([&] { cuda->nccl_comm_init_rank(&silent, 2, quiet, 1); });
  void* waiting = nullptr;
  const bool joined = cuda->nccl_comm_init_rank(&waiting, 2, quiet, 0) == SAPIPE_OK;
  joiner.join();
  unsetenv("SAPIPE_HOST_NCCL_TIMEOUT_MS");
  float word = 1;
  const auto start = std::chrono::steady_clock::now();
  const sapipe_status first = joined ? cuda->nccl_all_reduce(waiting, &word, &word, 1, SAPIPE_NCCL_SUM, nullptr) : SAPIPE_ERR_INTERNAL;
  const std::string first_why = cuda->last_error();
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  const sapipe_status later = joined ? cuda->nccl_all_reduce(waiting, &word, &word, 1, SAPIPE_NCCL_SUM, nullptr) : SAPIPE_ERR_INTERNAL;
  t.expect(joined && silent != nullptr && first == SAPIPE_ERR_TIMEOUT && waited >= 200 && waited < 5000 && later == SAPIPE_ERR_PEER_LOST,
           "a silent peer fails the collective with ERR_TIMEOUT at the bound, then ERR_PEER_LOST: " + first_why);
  if (waiting != nullptr) cuda->nccl_comm_abort(waiting);
  if (silent != nullptr) cuda->nccl_comm_abort(silent);
}

}  // namespace sapipe::tests
