#include "nccl_watchdog.h"

#include <thread>
#include <utility>

namespace sapipe::comm::nccl {

Outcome failed(sapipe_status status, std::string message) { return {status, std::move(message)}; }

Outcome usable(NcclState& st, void** comm) {
  std::lock_guard<std::mutex> lock(st.mutex);
  if (st.destroy_requested.load()) return failed(SAPIPE_ERR_DISPOSED, "the communicator was destroyed");
  if (st.comm == nullptr)
    return failed(SAPIPE_ERR_PEER_LOST, "the communicator is unusable (" + (st.broken.empty() ? std::string("not initialised") : st.broken) +
                                            "); every rank must create a new one");
  if (st.cuda->set_device(st.device) != SAPIPE_OK) return failed(SAPIPE_ERR_BACKEND_UNAVAILABLE, st.cuda->last_error());
  *comm = st.comm;
  return {};
}

Outcome wait_for(NcclState& st, void* comm, std::initializer_list<void*> streams, Clock::time_point deadline, const char* what) {
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    bool all_done = true;
    for (void* s : streams) {
      int32_t done = 0;
      if (st.cuda->stream_query(s, &done) != SAPIPE_OK) return failed(SAPIPE_ERR_INTERNAL, st.cuda->last_error());
      all_done = all_done && done != 0;
    }
    if (all_done) return {};
    Outcome out;
    int32_t nccl_error = 0;
    if (st.cuda->nccl_comm_async_error(comm, &nccl_error) != SAPIPE_OK)
      out = failed(SAPIPE_ERR_PEER_LOST, std::string(what) + ": " + st.cuda->last_error());
    else if (nccl_error != 0 && nccl_error != 7 /* ncclInProgress */)
      out = failed(SAPIPE_ERR_PEER_LOST, std::string(what) + ": NCCL reported error " + std::to_string(nccl_error) +
                                             " (a peer died or the network failed)");
    else if (st.destroy_requested.load())
      out = failed(SAPIPE_ERR_DISPOSED, std::string(what) + ": the communicator was destroyed while the operation was in flight");
    else if (Clock::now() >= deadline)
      out = failed(SAPIPE_ERR_TIMEOUT, std::string(what) + ": not finished within " + std::to_string(st.timeout_ms) +
                                           " ms (a peer may have died or not called it)");
    if (out.status != SAPIPE_OK) {
      std::lock_guard<std::mutex> lock(st.mutex);
      st.release_locked(out.message + "; the communicator was aborted");
      return out;
    }
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(1)) pause *= 2;
  }
}

}  // namespace sapipe::comm::nccl
