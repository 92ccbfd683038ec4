// A transport plugin's C table (include/sapipe/comm.h) seen as a Transport, so that the ring
// algorithms run over it unchanged. One object per operation: it names the channel the operation
// talks on and collects the plugin's failure details.
#pragma once

#include <chrono>
#include <string>

#include "sapipe/comm.h"
#include "transport.h"

namespace sapipe::comm {

// Deadline as the C ABI takes it: CLOCK_MONOTONIC milliseconds (steady_clock on Linux).
inline int64_t deadline_ms(Deadline d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d.time_since_epoch()).count();
}

class PluginTransport final : public Transport {
 public:
  PluginTransport(const sapipe_comm_plugin_v1* plugin, sapipe_comm_transport* handle, int rank, int size, int channel,
                  size_t chunk_count, std::string* detail)
      : plugin_(plugin), handle_(handle), rank_(rank), size_(size), channel_(channel), chunk_count_(chunk_count), detail_(detail) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t chunk_count() const override { return chunk_count_; }

  sapipe_status isend(int peer, const float* data, size_t count, std::unique_ptr<SendHandle>* handle) override {
    auto h = std::make_unique<Handle>(plugin_, handle_);
    sapipe_status s = noted(plugin_->isend(handle_, peer, channel_, 0, data, count * sizeof(float), &h->request));
    if (s == SAPIPE_OK) *handle = std::move(h);
    return s;
  }
  sapipe_status wait_send(SendHandle& handle, Deadline deadline) override {
    auto& h = static_cast<Handle&>(handle);
    if (h.request == nullptr) return SAPIPE_ERR_INTERNAL;
    sapipe_comm_request* request = h.request;
    h.request = nullptr;  // released by wait_send whatever it returns
    return noted(plugin_->wait_send(handle_, request, deadline_ms(deadline)));
  }
  sapipe_status recv(int peer, float* data, size_t count, Deadline deadline) override {
    return noted(plugin_->recv(handle_, peer, channel_, data, count * sizeof(float), deadline_ms(deadline)));
  }

 private:
  // A handle dropped without wait_send (an early return) still releases its request: with a past
  // deadline, wait_send cancels the send, so the buffer is not read after the operation ends.
  struct Handle : SendHandle {
    Handle(const sapipe_comm_plugin_v1* p, sapipe_comm_transport* t) : plugin(p), transport(t) {}
    ~Handle() override {
      if (request != nullptr) plugin->wait_send(transport, request, 0);
    }
    const sapipe_comm_plugin_v1* plugin;
    sapipe_comm_transport* transport;
    sapipe_comm_request* request = nullptr;
  };
  sapipe_status noted(sapipe_status s) {
    if (s != SAPIPE_OK && detail_ != nullptr && detail_->empty()) *detail_ = plugin_->last_error();
    return s;
  }
  const sapipe_comm_plugin_v1* plugin_;
  sapipe_comm_transport* handle_;
  int rank_, size_, channel_;
  size_t chunk_count_;
  std::string* detail_;
};

}  // namespace sapipe::comm
