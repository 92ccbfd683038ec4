// The regions (include/sapipe/comm.h: memory that peers on the same machine map and read
// directly) of one UcxComm: this rank's own, found by address, and the peers' that this rank has
// mapped, found by (peer, region id).
//
// A collective's header names the region its buffer lies in (id and offset). The first time a rank
// uses a region it also announces the region's key, and every peer maps it; a rank that freed an
// announced region says so in its next headers, and the peers unmap it. So the ranks learn of each
// other's regions as they use them, in the collectives' own order, with no extra round trip once
// a region is known.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../../core/aligned_buffer.h"
#include "sapipe/comm.h"

namespace sapipe::comm::ucx {

class SharedRegions : public std::enable_shared_from_this<SharedRegions> {
 public:
  SharedRegions(const sapipe_comm_plugin_v1* plugin, sapipe_comm_transport* transport) : plugin_(plugin), transport_(transport) {}

  // A zeroed buffer of `elements` floats in a new region; dropping the buffer frees the region.
  // Null with *status and *detail set when the transport cannot allocate it.
  std::shared_ptr<AlignedBuffer> allocate(size_t elements, sapipe_status* status, std::string* detail);

  struct Use {
    uint64_t id = 0;  // 0: not in a region of this rank
    uint64_t offset = 0;
    std::vector<uint8_t> key;  // non-empty: peers have not seen this region yet
  };
  // The region holding [data, data + bytes) (bytes > 0), with its key if it was never announced.
  Use find(const void* data, size_t bytes);
  // The region's key reached every peer.
  void announced(uint64_t id);
  // Up to `max` ids of announced regions freed since the last call.
  std::vector<uint64_t> take_freed(size_t max);

  // Maps peer's region `id`; false (with *detail) if the transport cannot.
  bool map(int peer, uint64_t id, const uint8_t* key, size_t bytes, std::string* detail);
  void unmap(int peer, uint64_t id);
  // Peer's region `id` at byte `offset`, if mapped and [offset, offset + bytes) lies inside it.
  float* view(int peer, uint64_t id, uint64_t offset, size_t bytes);
  // Undoes every mapping; before the transport is destroyed.
  void unmap_all();

 private:
  struct Own {
    sapipe_comm_region* region = nullptr;
    size_t bytes = 0;
    uint64_t id = 0;
    bool announced = false;
  };
  struct Mapped {
    sapipe_comm_peer_region* mapping = nullptr;
    uint8_t* data = nullptr;
    size_t length = 0;
  };
  void release(float* data);

  const sapipe_comm_plugin_v1* plugin_;
  sapipe_comm_transport* transport_;
  std::mutex mutex_;
  std::map<uintptr_t, Own> own_;  // by first address
  uint64_t next_id_ = 1;
  std::deque<uint64_t> freed_;
  std::map<std::pair<int, uint64_t>, Mapped> mapped_;
};

}  // namespace sapipe::comm::ucx
