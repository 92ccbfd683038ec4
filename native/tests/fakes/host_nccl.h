// The NCCL of the host-memory CUDA plugin (plugin_host_memory.cpp): the ranks of a unique id, in
// threads of one process or in several processes of one machine, joined by a full mesh of Unix
// domain sockets in the abstract namespace (named after the id's random token, so cliques never
// meet by accident and nothing is left on disk). Every operation is synchronous on the calling
// thread, as every entry of that plugin is, and bounded: a peer that closes its end (it exited,
// died or aborted) fails the call with SAPIPE_ERR_PEER_LOST at once, one that stays silent with
// SAPIPE_ERR_TIMEOUT after the bound (SAPIPE_HOST_NCCL_TIMEOUT_MS, default 30 000 ms; the real
// plugin's callers bound their waits themselves, which a blocking entry cannot leave to them).
// After any failure the communicator closes its sockets (its peers then fail at once too, as
// after ncclCommAbort) and every later call fails with SAPIPE_ERR_PEER_LOST.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sapipe/plugin.h"
#include "sapipe/status.h"

namespace sapipe::fakes {

class HostNccl {
 public:
  // A fresh id: a marker and a random token.
  static void unique_id(uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES]);
  // Joins the clique of `id` as `rank` of `size`; blocks until every rank has joined (bounded).
  static sapipe_status join(const uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES], int32_t size, int32_t rank, HostNccl** out, std::string* why);
  ~HostNccl();
  HostNccl(const HostNccl&) = delete;
  HostNccl& operator=(const HostNccl&) = delete;

  int32_t rank() const { return rank_; }
  int32_t size() const { return size_; }
  bool broken() const { return !broken_.empty(); }

  // As NCCL's (fp32; average = sum / size). Every rank sums the contributions in rank order, so
  // every rank ends with the same bits.
  sapipe_status all_reduce(const float* send, float* recv, size_t count, bool average, std::string* why);
  sapipe_status reduce_scatter(const float* send, float* recv, size_t recv_count, bool average, std::string* why);
  sapipe_status all_gather(const float* send, float* recv, size_t send_count, std::string* why);
  sapipe_status broadcast(const float* send, float* recv, size_t count, int32_t root, std::string* why);
  // A send returns once the peer's matching recv has taken it; pairs match in issue order per peer.
  sapipe_status send(const float* buffer, size_t count, int32_t peer, std::string* why);
  sapipe_status recv(float* buffer, size_t count, int32_t peer, std::string* why);

 private:
  HostNccl(int32_t rank, int32_t size, int64_t timeout_ms) : rank_(rank), size_(size), timeout_ms_(timeout_ms), fds_(size, -1) {}

  // What one operation sends to and receives from one peer: a header (the operation and its byte
  // count, checked on arrival: peers that called different operations fail instead of mixing
  // data) and the payload.
  struct Leg {
    int32_t peer = -1;
    const void* out = nullptr;
    size_t out_bytes = 0;
    bool sends = false;
    void* in = nullptr;
    size_t in_bytes = 0;
    bool receives = false;
  };
  // Moves every leg's bytes at once (so that ranks sending to each other never wait on each
  // other's full socket buffers), until all are through, a peer is lost or the bound passes.
  sapipe_status exchange(uint32_t op, std::vector<Leg>& legs, const char* what, std::string* why);
  sapipe_status fail(sapipe_status status, const std::string& message, std::string* why);
  sapipe_status check_usable(const char* what, std::string* why);
  void close_all();

  int32_t rank_;
  int32_t size_;
  int64_t timeout_ms_;
  std::vector<int> fds_;  // one connected socket per peer; -1 for itself
  std::string broken_;    // why the communicator failed; "" while usable
};

}  // namespace sapipe::fakes
