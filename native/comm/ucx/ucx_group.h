// The UCX backend's group protocol, without Node: one rank's link to the transport plugin
// (sapipe_ucx.so), and how a collective runs over it. Every collective first swaps a small header
// (kind, sizes, root, the shared region its buffer lies in) around the ring, so that ranks that
// disagree all fail alike with ERR_SIZE_MISMATCH before any data moves; a collective that fails
// after that (a lost peer, a timeout) leaves the ranks out of step, so later collectives fail at
// once with the same error. When every rank passes a buffer in a shared region (shared_regions.h)
// and all ranks run on one machine, the collective reads the peers' buffers directly
// (../direct.h) instead of sending the bytes around the ring (../ring.h).
// native/addon/comm_ucx_binding.cpp is its JS face.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../collective.h"
#include "../plugin_transport.h"
#include "sapipe/comm.h"
#include "shared_regions.h"

namespace sapipe::comm::ucx {

// One rank's transport, shared by the JS object and its queued operations; the last owner closes it.
struct Link {
  const sapipe_comm_plugin_v1* plugin = nullptr;
  sapipe_comm_transport* transport = nullptr;
  int rank = 0, size = 1;
  size_t chunk_count = 0;
  std::shared_ptr<SharedRegions> regions;  // also held by every buffer allocated in a region
  bool all_local = false;  // every rank runs on this machine (set by connect, before any collective)
  bool direct_allowed = true;  // false: every collective runs the ring (algorithm 'ring')
  std::mutex mutex;
  sapipe_status broken = SAPIPE_OK;  // why collectives can no longer run (ranks out of step)
  std::string broken_detail;
  // A rank could not map a peer's region: every rank learnt it in the same collective, and from
  // then on all of them move bytes by messages. Touched by the collective queue's thread only.
  bool direct_disabled = false;
  std::atomic<uint64_t> direct_runs{0};  // collectives that read peers' buffers directly

  ~Link();
  PluginTransport over(int channel, std::string* detail);
  void break_collectives(sapipe_status s, const std::string& detail);
};

// Connects the link to every rank (on a queue's thread): addresses[r] is rank r's worker address
// as the rendezvous swapped it, remote[r] non-zero when rank r runs on another machine (UCX then
// watches it for failure; see comm.h). On failure *detail holds the plugin's reason.
sapipe_status connect_link(Link& link, const std::vector<std::vector<uint8_t>>& addresses, const std::vector<int32_t>& remote,
                           Deadline deadline, std::string* detail);

// Whether every rank runs on this machine (no remote flag set): the condition for collectives to
// read peers' shared regions directly. Set on the link before any collective is queued.
bool all_local(const std::vector<int32_t>& remote);

// The user's point-to-point messages (SAPIPE_COMM_CHANNEL_USER). A send is synchronous: it
// completes once the peer has taken the message (the buffer may then be reused, and the peer has
// really received it, as Communicator.send promises).
sapipe_status send_to_peer(Link& link, int peer, const float* data, size_t count, Deadline deadline, std::string* detail);
sapipe_status recv_from_peer(Link& link, int peer, float* data, size_t count, Deadline deadline, std::string* detail);

// Runs one collective of this rank over the link (on the collective queue's thread): the header
// swap, the shared-memory decision, then the ring or the direct algorithm. *non_finite counts the
// non-finite results; on failure *detail says why and later collectives fail alike.
sapipe_status run_group_collective(Link& link, const CollectiveArgs& args, Deadline deadline, int64_t* non_finite,
                                   std::string* detail);

}  // namespace sapipe::comm::ucx
