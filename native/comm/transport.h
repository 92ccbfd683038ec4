// The C++ view of a point-to-point transport that the ring algorithm runs on. Implemented by the
// local backend (over its shared-memory channels, so the ring is tested without a network) and,
// through sapipe_comm_transport (include/sapipe/comm.h), by transport plugins such as UCX.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "sapipe/status.h"

namespace sapipe::comm {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

class SendHandle {
 public:
  virtual ~SendHandle() = default;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Elements per message when the ring algorithms split a part into chunks that pipeline (chunk k
  // is reduced while chunk k+1 is in flight); 0 sends each part as one message.
  virtual size_t chunk_count() const { return 0; }
  // Non-blocking send; `data` must stay valid until wait_send returns for the handle.
  virtual sapipe_status isend(int peer, const float* data, size_t count, std::unique_ptr<SendHandle>* handle) = 0;
  virtual sapipe_status wait_send(SendHandle& handle, Deadline deadline) = 0;
  virtual sapipe_status recv(int peer, float* data, size_t count, Deadline deadline) = 0;
};

}  // namespace sapipe::comm
