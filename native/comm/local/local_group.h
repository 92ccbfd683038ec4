// A group of ranks that live in one process (worker_threads, each with its own copy of the JS
// environment but one shared copy of this library). Ranks exchange nothing: each rank registers
// the buffers of a collective, and every rank then reduces or copies its own disjoint slice of the
// peers' buffers directly, so n ranks use n cores and every byte crosses memory once.
//
// A collective is: post arguments -> arrival barrier -> validate (every rank sees the same
// arguments, so every rank reaches the same verdict) -> work on the own slice -> departure barrier.
// A rank's buffers stay registered until every rank has left the work phase, so no rank can
// touch memory that its owner has already released. Every wait is bounded by the rank's timeout;
// a rank that dies or times out breaks the group, which fails the pending and later operations of
// every rank with SAPIPE_ERR_PEER_LOST. A rank that leaves (destroy()) fails every collective and
// every point-to-point wait on itself, but not messages between the ranks that stay: a ring
// collective that the leaving rank has finished may still be finishing between the others.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../collective.h"
#include "../transport.h"

namespace sapipe::comm::local {

// The collective vocabulary every host backend shares (native/comm/collective.h).
using comm::CollectiveArgs;
using comm::CollectiveKind;
using comm::ReduceUpdateJob;

// One pending point-to-point message (the sender's buffer, read in place by the receiver).
struct SendSlot {
  const float* data = nullptr;
  size_t count = 0;
  bool taken = false;  // a receiver is copying it
  bool done = false;   // copied, or refused (status)
  sapipe_status status = SAPIPE_OK;
};

class Group {
 public:
  Group(std::string name, int size);
  const std::string& name() const { return name_; }
  int size() const { return size_; }

  // Registry use: whether `rank` may join, and joining it.
  sapipe_status join(int rank);
  // True once every rank that joined has left or the group is broken: the name may be reused.
  bool finished() const;

  // Waits until every rank has joined.
  sapipe_status wait_ready(int rank, Deadline deadline, std::string* detail);
  sapipe_status collective(int rank, const CollectiveArgs& args, Deadline deadline, int64_t* non_finite,
                           std::string* detail);

  // Point-to-point messages on channel `tag` (kUserChannel for send/recv, kRingChannel for the ring
  // algorithm, so that a collective and the user's messages between the same ranks never mix).
  static constexpr int kUserChannel = 0, kRingChannel = 1, kChannels = 2;
  sapipe_status post_send(int rank, int peer, int tag, const float* data, size_t count,
                          std::shared_ptr<SendSlot>* slot, std::string* detail);
  sapipe_status wait_send(int rank, int peer, int tag, const std::shared_ptr<SendSlot>& slot, Deadline deadline,
                          std::string* detail);
  sapipe_status recv(int rank, int peer, int tag, float* data, size_t count, Deadline deadline, std::string* detail);

  // The rank's destroy() (lost = false) or the end of its thread (lost = true). Idempotent.
  void leave(int rank, bool lost);

 private:
  struct RankState {
    bool joined = false;
    bool gone = false;
    uint64_t epoch = 0;  // barriers passed through (arrived at)
    CollectiveArgs args;
    int64_t non_finite = 0;
  };
  sapipe_status barrier(std::unique_lock<std::mutex>& lock, int rank, Deadline deadline, const char* what,
                        std::string* detail);
  static constexpr int kAnyPeer = -1;
  // Under the lock: the failure a waiting rank reports, or SAPIPE_OK. `peer`: the one rank a
  // point-to-point wait depends on; kAnyPeer for collectives, which depend on every rank.
  sapipe_status failure(int rank, std::string* detail, int peer = kAnyPeer) const;
  void break_group(const std::string& reason);
  // Waits (bounded: work phases never block) until no rank touches peers' buffers.
  void wait_quiet(std::unique_lock<std::mutex>& lock);
  template <class Ready>
  bool wait_until(std::unique_lock<std::mutex>& lock, int rank, Deadline deadline, Ready ready, int peer = kAnyPeer);
  // The same on a channel's own condition variable (point-to-point waits).
  template <class Ready>
  bool wait_until_on(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, int rank, Deadline deadline, Ready ready, int peer);
  // Wakes every waiter, collective or point-to-point (a rank left, the group broke).
  void notify_everyone();

  const std::string name_;
  const int size_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<RankState> ranks_;
  std::vector<std::deque<std::shared_ptr<SendSlot>>> channels_;  // [(from * size + to) * kChannels + tag]
  // One per channel, so that a message posted or taken wakes the two ranks of its channel, not
  // every thread waiting in the group: on a machine with fewer cores than waiting threads, waking
  // them all takes the cores from the stages that compute.
  std::unique_ptr<std::condition_variable[]> channel_cvs_;
  size_t channel_index(int from, int to, int tag) const {
    return (static_cast<size_t>(from) * static_cast<size_t>(size_) + static_cast<size_t>(to)) * kChannels + static_cast<size_t>(tag);
  }
  int working_ = 0;  // ranks between their arrival at a collective and the end of its work (see collective())
  bool broken_ = false;
  std::string broken_reason_;
};

}  // namespace sapipe::comm::local
