// The local group's point-to-point channels seen as a Transport, so that the transport-independent
// ring algorithm runs (and is tested) on the local backend too.
#pragma once

#include <memory>
#include <string>

#include "../transport.h"
#include "local_group.h"

namespace sapipe::comm::local {

class LocalTransport final : public Transport {
 public:
  LocalTransport(std::shared_ptr<Group> group, int rank, std::string* detail)
      : group_(std::move(group)), rank_(rank), detail_(detail) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  sapipe_status isend(int peer, const float* data, size_t count, std::unique_ptr<SendHandle>* handle) override {
    auto h = std::make_unique<Handle>();
    h->peer = peer;
    sapipe_status s = group_->post_send(rank_, peer, Group::kRingChannel, data, count, &h->slot, detail_);
    *handle = std::move(h);
    return s;
  }
  sapipe_status wait_send(SendHandle& handle, Deadline deadline) override {
    auto& h = static_cast<Handle&>(handle);
    if (!h.slot) return SAPIPE_ERR_INTERNAL;
    return group_->wait_send(rank_, h.peer, Group::kRingChannel, h.slot, deadline, detail_);
  }
  sapipe_status recv(int peer, float* data, size_t count, Deadline deadline) override {
    return group_->recv(rank_, peer, Group::kRingChannel, data, count, deadline, detail_);
  }

 private:
  struct Handle : SendHandle {
    int peer = 0;
    std::shared_ptr<SendSlot> slot;
  };
  std::shared_ptr<Group> group_;
  int rank_;
  std::string* detail_;
};

}  // namespace sapipe::comm::local
