// The NCCL backend's watchdog, without Node: one rank's communicator state as the addon holds it
// (the CUDA plugin's table, streams, the communicator), and how an operation waits for its
// streams. NCCL operations hang for ever when a peer dies; here waits poll the streams and
// ncclCommGetAsyncError, and the communicator is aborted (never a blocking destroy) after an NCCL
// error (ERR_PEER_LOST), the timeout (ERR_TIMEOUT) or destroy(), after which every operation fails
// with ERR_PEER_LOST saying why. native/addon/device/comm_nccl_binding.cpp is its JS face.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <string>

#include "sapipe/plugin.h"

namespace sapipe::comm::nccl {

using Clock = std::chrono::steady_clock;

// What the JS wrapper and its queued operations share.
struct NcclState {
  const sapipe_cuda_plugin_v1* cuda = nullptr;
  int32_t device = 0, size = 0, rank = 0;
  int64_t timeout_ms = 0;
  void* comm_stream = nullptr;
  void* compute_stream = nullptr;
  int64_t* count_word = nullptr;  // device: the non-finite count of a reduction's result
  std::atomic<bool> destroy_requested{false};
  std::atomic<int> in_flight{0};  // queued operations (changed on the JS thread only)
  std::mutex mutex;               // guards comm and broken
  void* comm = nullptr;
  std::string broken;             // why the communicator is unusable; "" while usable

  // Aborts (never a blocking destroy: a peer may be gone) and frees the streams. Under mutex.
  void release_locked(const std::string& why) {
    if (comm != nullptr) {
      cuda->set_device(device);
      cuda->nccl_comm_abort(comm);
      comm = nullptr;
    }
    for (void** s : {&comm_stream, &compute_stream})
      if (*s != nullptr) {
        cuda->stream_destroy(*s);
        *s = nullptr;
      }
    if (count_word != nullptr) {
      cuda->free_device(count_word);
      count_word = nullptr;
    }
    if (broken.empty()) broken = why;
  }
  ~NcclState() {
    std::lock_guard<std::mutex> lock(mutex);
    release_locked("destroyed");
  }
};

// The outcome of work done on the worker thread: a status and the plugin's message, read there
// (last_error is per thread).
struct Outcome {
  sapipe_status status = SAPIPE_OK;
  std::string message;
};

Outcome failed(sapipe_status status, std::string message);

// The communicator if usable, with its device current on this thread.
Outcome usable(NcclState& st, void** comm);

// Waits until every stream is idle, polling NCCL's asynchronous error; aborts the communicator
// after an NCCL error, the deadline, or destroy().
Outcome wait_for(NcclState& st, void* comm, std::initializer_list<void*> streams, Clock::time_point deadline, const char* what);

}  // namespace sapipe::comm::nccl
