#include "local_group.h"

#include <algorithm>
#include <cstring>

#include "../../core/host_kernels.h"
#include "../../core/thread_pool.h"
#include "../partition.h"

namespace sapipe::comm::local {
namespace {

// Reductions go through a scratch block that stays in L1: the sum of one block is computed once
// (rank order 0..n-1, so every element is summed in the same order whichever rank owns it) and then
// written to every destination, so each byte of every buffer is read once and written once.
constexpr size_t kBlock = 4096;
// Threads split an update at multiples of this many floats (a cache line), as the CPU API does.
constexpr size_t kAlignElements = 16;

struct Scratch {
  alignas(64) float data[kBlock];
};

float* scratch() {
  thread_local Scratch s;
  return s.data;
}

const char* kind_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kAllreduce: return "allreduce";
    case CollectiveKind::kReduceScatter: return "reduceScatter";
    case CollectiveKind::kAllgather: return "allgather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kReduceScatterInPlace: return "reduceScatter (in place)";
    case CollectiveKind::kAllgatherInPlace: return "allgather (in place)";
    case CollectiveKind::kReduceUpdate: return "sharded all-reduce + update";
    case CollectiveKind::kUpdateFromParts: return "replicated update from the reduced parts";
  }
  return "collective";
}

bool overlaps(const float* a, size_t na, const float* b, size_t nb) {
  if (na == 0 || nb == 0) return false;
  return a < b + nb && b < a + na;
}

// Ranks write each other's weights and predicted weights: every rank must have the buffers the
// others write into, and they must not overlap any peer's (possible with several ranks on one
// thread). The update itself must be the same on every rank, or replicas would drift apart.
sapipe_status validate_reduce_update(const std::vector<CollectiveArgs>& a, std::string* detail) {
  const size_t n = a.size();
  const std::string what = kind_name(a[0].kind);
  for (size_t r = 0; r < n; ++r) {
    if (a[r].job == nullptr) {
      *detail = what + ": rank " + std::to_string(r) + " passed no update";
      return SAPIPE_ERR_INVALID_ARGUMENT;
    }
  }
  const ReduceUpdateJob& z = *a[0].job;
  for (size_t r = 1; r < n; ++r) {
    const ReduceUpdateJob& j = *a[r].job;
    const sapipe_update_config &c = j.config, &c0 = z.config;
    if (c.optimizer != c0.optimizer || c.lr != c0.lr || c.weight_decay != c0.weight_decay || c.momentum != c0.momentum ||
        c.beta1 != c0.beta1 || c.beta2 != c0.beta2 || c.eps != c0.eps || c.step != c0.step ||
        c.grad_scale != c0.grad_scale || c.compensation != c0.compensation || c.prediction != c0.prediction ||
        c.estimate != c0.estimate) {
      *detail = what + ": rank " + std::to_string(r) +
                " configured another update than rank 0 (optimizer, hyper-parameters, step, compensation or "
                "prediction); every rank must step the same optimizer";
      return SAPIPE_ERR_INVALID_ARGUMENT;
    }
    if ((j.buffers.predicted == nullptr) != (z.buffers.predicted == nullptr)) {
      *detail = what + ": ranks disagree on whether predicted weights are written";
      return SAPIPE_ERR_INVALID_ARGUMENT;
    }
  }
  // Sharded, ranks write each other's weights and predicted weights; replicated, each rank writes
  // its own while its peers read its gradient: either way no rank's written range may meet a
  // peer's buffer (possible with several ranks on one thread sharing a ParamSet).
  const bool replicated = a[0].kind == CollectiveKind::kUpdateFromParts;
  for (size_t r = 0; r < n; ++r) {
    const sapipe_update_buffers& b = a[r].job->buffers;
    for (size_t q = 0; q < n; ++q) {
      if (q == r) continue;
      const sapipe_update_buffers& p = a[q].job->buffers;
      // Replicated, each rank also writes its own state and reads its peers' gradients.
      const auto from = [](const float* x, size_t o) { return x ? x + o : nullptr; };
      const float* written[6] = {b.weights + b.offset,
                                 from(b.predicted, b.offset),
                                 replicated ? from(b.momentum, b.offset) : nullptr,
                                 replicated ? from(b.second_moment, b.offset) : nullptr,
                                 replicated ? from(b.backup, b.offset) : nullptr,
                                 replicated ? from(b.prev_local_grad, b.offset) : nullptr};
      const float* peer[8] = {p.weights + p.offset,
                              from(p.predicted, p.offset),
                              replicated ? a[q].input : nullptr,
                              replicated ? from(p.momentum, p.offset) : nullptr,
                              replicated ? from(p.second_moment, p.offset) : nullptr,
                              replicated ? from(p.backup, p.offset) : nullptr,
                              replicated ? from(p.prev_local_grad, p.offset) : nullptr,
                              replicated ? from(p.local_grad, p.offset) : nullptr};
      for (const float* w : written)
        for (const float* x : peer)
          if (w && x && overlaps(w, b.count, x, p.count)) {
            *detail = what + ": ranks " + std::to_string(q) + " and " + std::to_string(r) +
                      " passed the same weights or gradients; each rank needs its own ParamSet";
            return SAPIPE_ERR_ALIASING;
          }
    }
  }
  return SAPIPE_OK;
}

// Every rank runs this on the same snapshot of arguments, so all reach the same verdict.
sapipe_status validate(const std::vector<CollectiveArgs>& a, std::string* detail) {
  const size_t n = a.size();
  const CollectiveArgs& z = a[0];
  for (size_t r = 1; r < n; ++r) {
    if (a[r].kind != z.kind) {
      *detail = std::string("rank 0 called ") + kind_name(z.kind) + " but rank " + std::to_string(r) + " called " +
                kind_name(a[r].kind) + "; every rank must issue the same collectives in the same order";
      return SAPIPE_ERR_INVALID_ARGUMENT;
    }
    if (a[r].input_count != z.input_count || a[r].output_count != z.output_count) {
      *detail = std::string(kind_name(z.kind)) + ": rank 0 passed " + std::to_string(z.input_count) + " elements, rank " +
                std::to_string(r) + " passed " + std::to_string(a[r].input_count) +
                (a[r].input_count == z.input_count ? " (outputs differ: " + std::to_string(z.output_count) + " vs " +
                                                         std::to_string(a[r].output_count) + ")"
                                                   : "") +
                "; every rank must pass buffers of the same length";
      return SAPIPE_ERR_SIZE_MISMATCH;
    }
    if (a[r].root != z.root || a[r].scale != z.scale) {
      *detail = std::string(kind_name(z.kind)) + ": ranks disagree on the root or the reduction (sum/avg)";
      return SAPIPE_ERR_INVALID_ARGUMENT;
    }
  }
  if (z.kind == CollectiveKind::kReduceScatter && z.input_count != z.output_count * n) {
    *detail = "reduceScatter: the input must have size x the output's elements";
    return SAPIPE_ERR_SIZE_MISMATCH;
  }
  if (z.kind == CollectiveKind::kAllgather && z.output_count != z.input_count * n) {
    *detail = "allgather: the output must have size x the input's elements";
    return SAPIPE_ERR_SIZE_MISMATCH;
  }
  if (z.kind == CollectiveKind::kReduceUpdate || z.kind == CollectiveKind::kUpdateFromParts) {
    if (sapipe_status s = validate_reduce_update(a, detail); s != SAPIPE_OK) return s;
  }
  if (z.root < 0 || static_cast<size_t>(z.root) >= n) {
    *detail = "broadcast: root out of range";
    return SAPIPE_ERR_INVALID_ARGUMENT;
  }
  // Ranks read and write each other's memory: no rank's written range may overlap any buffer of
  // another rank (possible when several ranks live on one thread and share a buffer).
  const bool in_place = z.kind == CollectiveKind::kAllreduce || z.kind == CollectiveKind::kBroadcast ||
                        z.kind == CollectiveKind::kReduceScatterInPlace || z.kind == CollectiveKind::kAllgatherInPlace ||
                        z.kind == CollectiveKind::kUpdateFromParts;
  for (size_t r = 0; r < n; ++r) {
    for (size_t q = 0; q < n; ++q) {
      if (in_place) {
        if (q != r && overlaps(a[r].input, a[r].input_count, a[q].input, a[q].input_count)) {
          *detail = std::string(kind_name(z.kind)) + ": ranks " + std::to_string(q) + " and " + std::to_string(r) +
                    " passed the same memory; each rank needs its own buffer";
          return SAPIPE_ERR_ALIASING;
        }
      } else if (z.kind != CollectiveKind::kBarrier &&
                 (overlaps(a[r].output, a[r].output_count, a[q].input, a[q].input_count) ||
                  (q != r && overlaps(a[r].output, a[r].output_count, a[q].output, a[q].output_count)))) {
        *detail = std::string(kind_name(z.kind)) + ": an output overlaps an input or another rank's output";
        return SAPIPE_ERR_ALIASING;
      }
    }
  }
  return SAPIPE_OK;
}

// Sums block [lo, hi) of srcs into every destination; returns the non-finite results counted once.
int64_t reduce_range(const core::HostKernels& k, const std::vector<const float*>& srcs,
                     const std::vector<float*>& dsts, size_t lo, size_t hi, float scale) {
  int64_t bad = 0;
  float* tmp = scratch();
  std::vector<const float*> in(srcs.size());
  for (size_t b = lo; b < hi; b += kBlock) {
    const size_t len = std::min(kBlock, hi - b);
    for (size_t i = 0; i < srcs.size(); ++i) in[i] = srcs[i] + b;
    bad += k.sum(tmp, in.data(), in.size(), len, scale);
    for (float* d : dsts) k.copy(d + b, tmp, len);
  }
  return bad;
}

// kReduceUpdate (see ReduceUpdateJob). The sum is the all-reduce's (same kernel, same rank
// order), so the update equals all-reduce-then-update bit for bit.
int64_t reduce_update(const core::HostKernels& k, int rank, const std::vector<CollectiveArgs>& a) {
  const int n = static_cast<int>(a.size());
  const CollectiveArgs& me = a[static_cast<size_t>(rank)];
  const ReduceUpdateJob& job = *me.job;
  const sapipe_update_buffers& own = job.buffers;
  auto [lo, hi] = partition(me.input_count, n, rank);
  float* tmp = scratch();
  std::vector<const float*> in(a.size());
  int64_t bad = 0;
  for (size_t b = lo; b < hi; b += kBlock) {
    const size_t len = std::min(kBlock, hi - b);
    for (size_t i = 0; i < a.size(); ++i) in[i] = a[i].input + b;
    bad += k.sum(tmp, in.data(), in.size(), len, me.scale);
    const size_t s = own.offset + b;
    core::UpdatePointers p{own.weights + s,           tmp,
                          core::at(own.momentum, s),   core::at(own.second_moment, s),
                          core::at(own.backup, s),     core::at(own.predicted, s),
                          core::at(own.local_grad, s), core::at(own.prev_local_grad, s),
                          nullptr};  // the sharded step updates in place
    k.fused_update(job.plan, p, len);
    for (int q = 0; q < n; ++q) {
      if (q == rank) continue;
      const sapipe_update_buffers& peer = a[static_cast<size_t>(q)].job->buffers;
      k.copy(peer.weights + peer.offset + b, own.weights + s, len);
      if (own.predicted) k.copy(peer.predicted + peer.offset + b, own.predicted + s, len);
    }
  }
  return bad;
}

// kUpdateFromParts (see ReduceUpdateJob): this rank's whole range updated in place, part q's
// gradient read from rank q's buffer, where kReduceScatterInPlace left it averaged. The sums are
// the all-reduce's, so the update equals all-reduce-then-update bit for bit.
int64_t update_from_parts(const core::HostKernels& k, int rank, const std::vector<CollectiveArgs>& a) {
  const int n = static_cast<int>(a.size());
  const CollectiveArgs& me = a[static_cast<size_t>(rank)];
  const ReduceUpdateJob& job = *me.job;
  const sapipe_update_buffers& own = job.buffers;
  // The whole model is this rank's to update. With at least a core per rank, every rank runs on
  // its own thread at once (as the reductions do); with more cores than ranks, each rank's update
  // takes the calling thread's pool in turn, as a standalone step would.
  ThreadPool& pool = ThreadPool::current();
  const bool spread = pool.size() > n;
  for (int q = 0; q < n; ++q) {
    auto [lo, hi] = partition(me.input_count, n, q);
    if (hi <= lo) continue;
    const float* grad = a[static_cast<size_t>(q)].input + lo;
    auto range = [&](size_t b, size_t e) {
      const size_t s = own.offset + lo + b;
      core::UpdatePointers p{own.weights + s,           grad + b,
                            core::at(own.momentum, s),   core::at(own.second_moment, s),
                            core::at(own.backup, s),     core::at(own.predicted, s),
                            core::at(own.local_grad, s), core::at(own.prev_local_grad, s),
                            nullptr};
      k.fused_update(job.plan, p, e - b);
    };
    if (spread) pool.parallel_for(hi - lo, kAlignElements, [&](int, size_t b, size_t e) { range(b, e); });
    else range(0, hi - lo);
  }
  return 0;
}

int64_t work(int rank, const std::vector<CollectiveArgs>& a) {
  const core::HostKernels& k = core::host_kernels();
  const int n = static_cast<int>(a.size());
  const CollectiveArgs& me = a[static_cast<size_t>(rank)];
  std::vector<const float*> srcs;
  std::vector<float*> dsts;
  switch (me.kind) {
    case CollectiveKind::kBarrier: return 0;
    case CollectiveKind::kAllreduce: {
      auto [lo, hi] = partition(me.input_count, n, rank);
      for (const auto& x : a) {
        srcs.push_back(x.input);
        dsts.push_back(x.input);
      }
      return reduce_range(k, srcs, dsts, lo, hi, me.scale);
    }
    case CollectiveKind::kReduceScatterInPlace: {
      auto [lo, hi] = partition(me.input_count, n, rank);
      for (const auto& x : a) srcs.push_back(x.input);
      dsts.push_back(me.input);
      return reduce_range(k, srcs, dsts, lo, hi, me.scale);
    }
    case CollectiveKind::kReduceScatter: {
      const size_t m = me.output_count, base = m * static_cast<size_t>(rank);
      for (const auto& x : a) srcs.push_back(x.input + base);
      dsts.push_back(me.output);
      return reduce_range(k, srcs, dsts, 0, m, me.scale);
    }
    case CollectiveKind::kAllgather: {
      const size_t m = me.input_count;
      for (int q = 0; q < n; ++q)
        if (m) k.copy(me.output + m * static_cast<size_t>(q), a[static_cast<size_t>(q)].input, m);
      return 0;
    }
    case CollectiveKind::kBroadcast: {
      if (rank != me.root && me.input_count) k.copy(me.input, a[static_cast<size_t>(me.root)].input, me.input_count);
      return 0;
    }
    case CollectiveKind::kAllgatherInPlace: {
      // Each rank fills its own buffer from the owners' parts: it writes only its own memory and
      // reads only parts their owners do not write.
      for (int q = 0; q < n; ++q) {
        if (q == rank) continue;
        auto [lo, hi] = partition(me.input_count, n, q);
        if (hi > lo) k.copy(me.input + lo, a[static_cast<size_t>(q)].input + lo, hi - lo);
      }
      return 0;
    }
    case CollectiveKind::kReduceUpdate: return reduce_update(k, rank, a);
    case CollectiveKind::kUpdateFromParts: return update_from_parts(k, rank, a);
  }
  return 0;
}

}  // namespace

Group::Group(std::string name, int size)
    : name_(std::move(name)), size_(size), ranks_(static_cast<size_t>(size)),
      channels_(static_cast<size_t>(size) * static_cast<size_t>(size) * kChannels),
      channel_cvs_(new std::condition_variable[channels_.size()]) {}

void Group::notify_everyone() {
  cv_.notify_all();
  for (size_t i = 0; i < channels_.size(); ++i) channel_cvs_[i].notify_all();
}

sapipe_status Group::join(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  RankState& me = ranks_[static_cast<size_t>(rank)];
  if (me.joined) return SAPIPE_ERR_INVALID_ARGUMENT;
  me.joined = true;
  cv_.notify_all();
  return SAPIPE_OK;
}

bool Group::finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (broken_) return true;
  bool any = false;
  for (const RankState& r : ranks_) {
    if (r.joined && !r.gone) return false;
    any = any || r.joined;
  }
  return any;
}

sapipe_status Group::failure(int rank, std::string* detail, int peer) const {
  if (ranks_[static_cast<size_t>(rank)].gone) {
    *detail = "the communicator was destroyed";
    return SAPIPE_ERR_DISPOSED;
  }
  if (broken_) {
    *detail = broken_reason_;
    return SAPIPE_ERR_PEER_LOST;
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (static_cast<int>(r) == rank || !ranks_[r].gone || (peer != kAnyPeer && static_cast<int>(r) != peer)) continue;
    *detail = "group \"" + name_ + "\": rank " + std::to_string(r) + " left (destroy() was called)";
    return SAPIPE_ERR_PEER_LOST;
  }
  return SAPIPE_OK;
}

void Group::break_group(const std::string& reason) {
  if (!broken_) {
    broken_ = true;
    broken_reason_ = "group \"" + name_ + "\": " + reason;
  }
  notify_everyone();
}

void Group::wait_quiet(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [&] { return working_ == 0; });
}

template <class Ready>
bool Group::wait_until(std::unique_lock<std::mutex>& lock, int rank, Deadline deadline, Ready ready, int peer) {
  // The condition is checked before the failure state: a rank whose peers all arrived must not
  // report a peer that left right after arriving.
  std::string ignored;
  return cv_.wait_until(lock, deadline, [&] { return ready() || failure(rank, &ignored, peer) != SAPIPE_OK; }) && ready();
}

template <class Ready>
bool Group::wait_until_on(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, int rank, Deadline deadline, Ready ready, int peer) {
  std::string ignored;
  return cv.wait_until(lock, deadline, [&] { return ready() || failure(rank, &ignored, peer) != SAPIPE_OK; }) && ready();
}

sapipe_status Group::wait_ready(int rank, Deadline deadline, std::string* detail) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto all_joined = [&] {
    for (const RankState& r : ranks_)
      if (!r.joined) return false;
    return true;
  };
  if (wait_until(lock, rank, deadline, all_joined)) return SAPIPE_OK;
  if (sapipe_status s = failure(rank, detail); s != SAPIPE_OK) return s;
  std::string missing;
  for (size_t r = 0; r < ranks_.size(); ++r)
    if (!ranks_[r].joined) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  *detail = "ranks " + missing + " did not join group \"" + name_ + "\" within the timeout";
  break_group("rank " + std::to_string(rank) + " timed out waiting for ranks " + missing + " to join");
  return SAPIPE_ERR_TIMEOUT;
}

sapipe_status Group::barrier(std::unique_lock<std::mutex>& lock, int rank, Deadline deadline, const char* what,
                             std::string* detail) {
  RankState& me = ranks_[static_cast<size_t>(rank)];
  const uint64_t e = ++me.epoch;
  cv_.notify_all();
  auto arrived = [&] {
    for (const RankState& r : ranks_)
      if (r.epoch < e) return false;
    return true;
  };
  if (wait_until(lock, rank, deadline, arrived)) return SAPIPE_OK;
  if (sapipe_status s = failure(rank, detail); s != SAPIPE_OK) return s;
  std::string missing;
  for (size_t r = 0; r < ranks_.size(); ++r)
    if (ranks_[r].epoch < e) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  *detail = std::string(what) + ": ranks " + missing + " did not take part within the timeout";
  break_group("rank " + std::to_string(rank) + " timed out in " + what + " waiting for ranks " + missing);
  return SAPIPE_ERR_TIMEOUT;
}

sapipe_status Group::collective(int rank, const CollectiveArgs& args, Deadline deadline, int64_t* non_finite,
                                std::string* detail) {
  *non_finite = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  if (sapipe_status s = failure(rank, detail); s != SAPIPE_OK) return s;
  ranks_[static_cast<size_t>(rank)].args = args;
  const char* what = kind_name(args.kind);
  // A rank counts as working from its arrival until its work is done: once every rank has
  // arrived, each may read and write the others' buffers, and a rank must not be woken from the
  // arrival barrier (and start working) after a peer that failed the departure barrier found
  // nobody working and released its buffers. Counting from the arrival closes that window.
  ++working_;
  auto done_working = [&] {
    if (--working_ == 0) cv_.notify_all();
  };
  if (sapipe_status s = barrier(lock, rank, deadline, what, detail); s != SAPIPE_OK) {
    done_working();
    wait_quiet(lock);
    return s;
  }
  // Peers cannot post their next collective before the departure barrier below, so this
  // snapshot is the same on every rank.
  std::vector<CollectiveArgs> all;
  for (const RankState& r : ranks_) all.push_back(r.args);
  sapipe_status verdict = validate(all, detail);
  if (verdict == SAPIPE_OK) {
    lock.unlock();
    const int64_t bad = work(rank, all);
    lock.lock();
    ranks_[static_cast<size_t>(rank)].non_finite = bad;
  }
  done_working();
  if (sapipe_status s = barrier(lock, rank, deadline, what, detail); s != SAPIPE_OK) {
    wait_quiet(lock);
    return s;
  }
  if (verdict != SAPIPE_OK) return verdict;
  // Every rank has left the work phase and none can enter the next one before this rank arrives.
  for (const RankState& r : ranks_) *non_finite += r.non_finite;
  return SAPIPE_OK;
}

sapipe_status Group::post_send(int rank, int peer, int tag, const float* data, size_t count, std::shared_ptr<SendSlot>* slot,
                               std::string* detail) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (sapipe_status s = failure(rank, detail, peer); s != SAPIPE_OK) return s;
  auto s = std::make_shared<SendSlot>();
  s->data = data;
  s->count = count;
  const size_t index = channel_index(rank, peer, tag);
  channels_[index].push_back(s);
  *slot = s;
  channel_cvs_[index].notify_all();
  return SAPIPE_OK;
}

sapipe_status Group::wait_send(int rank, int peer, int tag, const std::shared_ptr<SendSlot>& slot, Deadline deadline,
                               std::string* detail) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::condition_variable& cv = channel_cvs_[channel_index(rank, peer, tag)];
  if (wait_until_on(cv, lock, rank, deadline, [&] { return slot->done; }, peer)) {
    if (slot->status == SAPIPE_ERR_SIZE_MISMATCH)
      *detail = "send to rank " + std::to_string(peer) + ": the receiver expected another number of elements";
    return slot->status;
  }
  // Withdraw the message, or wait for a receiver that is copying it (bounded: a copy never blocks).
  cv.wait(lock, [&] { return !slot->taken || slot->done; });
  auto& channel = channels_[channel_index(rank, peer, tag)];
  channel.erase(std::remove(channel.begin(), channel.end(), slot), channel.end());
  if (sapipe_status s = failure(rank, detail, peer); s != SAPIPE_OK) return s;
  *detail = "send to rank " + std::to_string(peer) + ": no matching recv within the timeout";
  break_group("rank " + std::to_string(rank) + " timed out sending to rank " + std::to_string(peer));
  return SAPIPE_ERR_TIMEOUT;
}

sapipe_status Group::recv(int rank, int peer, int tag, float* data, size_t count, Deadline deadline, std::string* detail) {
  std::unique_lock<std::mutex> lock(mutex_);
  const size_t index = channel_index(peer, rank, tag);
  auto& channel = channels_[index];
  std::condition_variable& cv = channel_cvs_[index];
  if (!wait_until_on(cv, lock, rank, deadline, [&] { return !channel.empty(); }, peer)) {
    if (sapipe_status s = failure(rank, detail, peer); s != SAPIPE_OK) return s;
    *detail = "recv from rank " + std::to_string(peer) + ": no message within the timeout";
    break_group("rank " + std::to_string(rank) + " timed out receiving from rank " + std::to_string(peer));
    return SAPIPE_ERR_TIMEOUT;
  }
  std::shared_ptr<SendSlot> slot = channel.front();
  channel.pop_front();
  if (slot->count != count) {
    slot->status = SAPIPE_ERR_SIZE_MISMATCH;
    slot->done = true;
    cv.notify_all();
    *detail = "recv from rank " + std::to_string(peer) + ": the message has " + std::to_string(slot->count) +
              " elements, the buffer " + std::to_string(count) + "; sender and receiver must agree on the size";
    return SAPIPE_ERR_SIZE_MISMATCH;
  }
  slot->taken = true;
  lock.unlock();
  if (count) core::host_kernels().copy(data, slot->data, count);
  lock.lock();
  slot->done = true;
  cv.notify_all();
  return SAPIPE_OK;
}

void Group::leave(int rank, bool lost) {
  std::lock_guard<std::mutex> lock(mutex_);
  RankState& me = ranks_[static_cast<size_t>(rank)];
  if (me.gone) return;
  me.gone = true;
  bool others = false;
  for (size_t r = 0; r < ranks_.size(); ++r)
    others = others || (static_cast<int>(r) != rank && !ranks_[r].gone);
  // A lost rank may have died inside any operation: the whole group breaks. A rank that left
  // fails what waits on it (see failure()), and nothing between the others.
  if (others && lost) break_group("rank " + std::to_string(rank) + " was lost (its thread or process ended)");
  notify_everyone();
}

}  // namespace sapipe::comm::local
