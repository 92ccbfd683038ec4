#include "ucx_group.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "../direct.h"
#include "../ring.h"

namespace sapipe::comm::ucx {

Link::~Link() {
  if (transport == nullptr) return;
  if (regions) regions->unmap_all();
  plugin->destroy(transport);
}

PluginTransport Link::over(int channel, std::string* detail) {
  return PluginTransport(plugin, transport, rank, size, channel, chunk_count, detail);
}

void Link::break_collectives(sapipe_status s, const std::string& detail) {
  std::lock_guard<std::mutex> lock(mutex);
  if (broken != SAPIPE_OK) return;
  broken = s;
  broken_detail = "an earlier collective failed, so the ranks are out of step: " + detail;
}

sapipe_status connect_link(Link& link, const std::vector<std::vector<uint8_t>>& addresses, const std::vector<int32_t>& remote,
                           Deadline deadline, std::string* detail) {
  if (addresses.size() != static_cast<size_t>(link.size) || remote.size() != addresses.size()) {
    *detail = "one address and one remote flag per rank are needed";
    return SAPIPE_ERR_INVALID_ARGUMENT;
  }
  std::vector<const void*> pointers;
  std::vector<size_t> lengths;
  for (const auto& a : addresses) {
    pointers.push_back(a.data());
    lengths.push_back(a.size());
  }
  const sapipe_status s = link.plugin->connect(link.transport, pointers.data(), lengths.data(), remote.data(), deadline_ms(deadline));
  if (s != SAPIPE_OK) *detail = link.plugin->last_error();
  return s;
}

bool all_local(const std::vector<int32_t>& remote) {
  return std::all_of(remote.begin(), remote.end(), [](int32_t r) { return r == 0; });
}

sapipe_status send_to_peer(Link& link, int peer, const float* data, size_t count, Deadline deadline, std::string* detail) {
  const sapipe_comm_plugin_v1* p = link.plugin;
  sapipe_comm_request* request = nullptr;
  sapipe_status s = p->isend(link.transport, peer, SAPIPE_COMM_CHANNEL_USER, 1, data, count * sizeof(float), &request);
  if (s == SAPIPE_OK) s = p->wait_send(link.transport, request, deadline_ms(deadline));
  if (s != SAPIPE_OK) *detail = p->last_error();
  return s;
}

sapipe_status recv_from_peer(Link& link, int peer, float* data, size_t count, Deadline deadline, std::string* detail) {
  const sapipe_comm_plugin_v1* p = link.plugin;
  const sapipe_status s = p->recv(link.transport, peer, SAPIPE_COMM_CHANNEL_USER, data, count * sizeof(float), deadline_ms(deadline));
  if (s != SAPIPE_OK) *detail = p->last_error();
  return s;
}

namespace {


// What every rank must agree on before a collective moves data, and where its buffer lies if it
// lies in a shared region (see shared_regions.h); 22 floats on the wire.
constexpr size_t kFreedPerHeader = 4;
struct Header {
  uint64_t kind, input_count, output_count, root;
  uint64_t region, offset, key_bytes;  // region 0: not in a shared region
  uint64_t freed[kFreedPerHeader];     // ids of this rank's regions freed since its last header (0: none)
};
constexpr size_t kHeaderFloats = sizeof(Header) / sizeof(float);
static_assert(sizeof(Header) % sizeof(float) == 0);

sapipe_status agree(Transport& t, const Header& mine, std::vector<Header>* all, std::string* detail, Deadline deadline,
                    bool* clean) {
  *clean = false;
  const int n = t.size();
  std::vector<float> wire(static_cast<size_t>(n) * kHeaderFloats);
  std::memcpy(wire.data() + static_cast<size_t>(t.rank()) * kHeaderFloats, &mine, sizeof mine);
  if (sapipe_status s = ring_allgather_blocks(t, wire.data(), kHeaderFloats, deadline); s != SAPIPE_OK) return s;
  *clean = true;
  all->resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    Header& h = (*all)[static_cast<size_t>(r)];
    std::memcpy(&h, wire.data() + static_cast<size_t>(r) * kHeaderFloats, sizeof h);
    const std::string who = "rank " + std::to_string(r);
    if (h.kind != mine.kind) {
      *detail = who + " called another collective at this point; every rank must issue the same collectives in the same order";
      return SAPIPE_ERR_INVALID_ARGUMENT;
    }
    if (h.root != mine.root) {
      *detail = who + " passed root " + std::to_string(h.root) + " where this rank passed " + std::to_string(mine.root);
      return SAPIPE_ERR_INVALID_ARGUMENT;
    }
    if (h.input_count != mine.input_count || h.output_count != mine.output_count) {
      *detail = who + " passed " + std::to_string(h.input_count) + " elements where this rank passed " +
                std::to_string(mine.input_count) + "; every rank must pass the same sizes";
      return SAPIPE_ERR_SIZE_MISMATCH;
    }
  }
  return SAPIPE_OK;
}

// The buffer that peers would read directly: the input of every kind that has one.
bool reads_peers(CollectiveKind kind) { return kind != CollectiveKind::kBarrier; }

// After the header swap: maps the regions peers announce, and
// decides (alike on every rank) whether this collective reads peers' buffers directly: *direct
// is set, and the views filled, when it does. A rank that lacks a view its peers expect it to
// have (an internal error) leaves the views empty with *direct set; it must then abandon.
sapipe_status prepare_direct(Link& l, Transport& t, const std::vector<Header>& headers, const Header& mine,
                             const std::vector<uint8_t>& my_key, bool* direct, Views* views, Deadline deadline,
                             std::string* detail) {
  *direct = false;
  const int n = t.size(), r = t.rank();
  views->clear();
  size_t key_bytes = 0;
  for (const Header& h : headers) key_bytes = std::max<size_t>(key_bytes, h.key_bytes);
  if (key_bytes > 0) {
    // Keys, padded to one block per rank, go around the ring; then every rank says whether it
    // could map them all, so that every rank draws the same conclusion.
    const size_t block = (key_bytes + sizeof(float) - 1) / sizeof(float);
    std::vector<float> keys(static_cast<size_t>(n) * block);
    if (mine.key_bytes > 0) std::memcpy(keys.data() + static_cast<size_t>(r) * block, my_key.data(), mine.key_bytes);
    if (sapipe_status s = ring_allgather_blocks(t, keys.data(), block, deadline); s != SAPIPE_OK) return s;
    bool mapped = true;
    std::string why;
    for (int q = 0; q < n && mapped; ++q) {
      const Header& h = headers[static_cast<size_t>(q)];
      if (q == r || h.key_bytes == 0) continue;
      mapped = l.regions->map(q, h.region, reinterpret_cast<const uint8_t*>(keys.data() + static_cast<size_t>(q) * block),
                              h.key_bytes, &why);
    }
    std::vector<int64_t> all_mapped;
    if (sapipe_status s = exchange_all(t, mapped ? 1 : 0, &all_mapped, deadline); s != SAPIPE_OK) return s;
    if (mine.key_bytes > 0) l.regions->announced(mine.region);
    for (int64_t m : all_mapped)
      if (m == 0) l.direct_disabled = true;
  }
  if (l.direct_disabled) return SAPIPE_OK;
  for (const Header& h : headers)
    if (h.region == 0) return SAPIPE_OK;
  *direct = true;
  const size_t bytes = static_cast<size_t>(mine.input_count) * sizeof(float);
  for (int q = 0; q < n; ++q) {
    const Header& h = headers[static_cast<size_t>(q)];
    float* v = q == r ? nullptr : l.regions->view(q, h.region, h.offset, bytes);
    if (q != r && v == nullptr) {
      *detail = "rank " + std::to_string(q) + "'s shared region " + std::to_string(h.region) + " is not mapped here";
      views->clear();
      return SAPIPE_OK;
    }
    views->push_back(v);
  }
  return SAPIPE_OK;
}

sapipe_status run_direct(Transport& t, const CollectiveArgs& a, Views views, Deadline d, int64_t* non_finite) {
  views[static_cast<size_t>(t.rank())] = a.input;
  *non_finite = 0;
  switch (a.kind) {
    case CollectiveKind::kAllreduce:
      return direct_allreduce(t, views, a.input_count, a.scale, d, non_finite);
    case CollectiveKind::kReduceScatter:
      return direct_reduce_scatter_blocks(t, views, a.output_count, a.output, a.scale, d, non_finite);
    case CollectiveKind::kAllgather:
      return direct_allgather_blocks(t, views, a.input_count, a.output, d);
    case CollectiveKind::kBroadcast:
      return direct_broadcast(t, views, a.input_count, a.root, d);
    case CollectiveKind::kReduceScatterInPlace:
      return direct_reduce_scatter(t, views, a.input_count, a.scale, d, non_finite);
    case CollectiveKind::kAllgatherInPlace:
      return direct_allgather(t, views, a.input_count, d);
    default:
      return SAPIPE_ERR_INVALID_ARGUMENT;
  }
}

sapipe_status run_collective(Transport& t, const CollectiveArgs& a, Deadline d, int64_t* non_finite) {
  const int n = t.size(), r = t.rank();
  *non_finite = 0;
  switch (a.kind) {
    case CollectiveKind::kBarrier:
      return SAPIPE_OK;  // the header swap was the barrier: every rank has sent its header
    case CollectiveKind::kAllreduce:
      return ring_allreduce(t, a.input, a.input_count, a.scale, d, non_finite);
    case CollectiveKind::kReduceScatter: {
      // The ring reduces in place and leaves partial sums in the other parts: work on a copy so
      // the caller's input stays as it was.
      const size_t m = a.output_count;
      std::vector<float> work(a.input, a.input + a.input_count);
      sapipe_status s = ring_reduce_scatter_blocks(t, work.data(), m, a.scale, d, non_finite);
      if (s == SAPIPE_OK && m > 0) std::memcpy(a.output, work.data() + static_cast<size_t>(r) * m, m * sizeof(float));
      return s;
    }
    case CollectiveKind::kAllgather: {
      const size_t m = a.input_count;
      if (m > 0) std::memcpy(a.output + static_cast<size_t>(r) * m, a.input, m * sizeof(float));
      return n == 1 ? SAPIPE_OK : ring_allgather_blocks(t, a.output, m, d);
    }
    case CollectiveKind::kBroadcast:
      return ring_broadcast(t, a.input, a.input_count, a.root, d);
    case CollectiveKind::kReduceScatterInPlace:
      return ring_reduce_scatter(t, a.input, a.input_count, a.scale, d, non_finite);
    case CollectiveKind::kAllgatherInPlace:
      return ring_allgather(t, a.input, a.input_count, d);
    default:
      return SAPIPE_ERR_INVALID_ARGUMENT;
  }
}

}  // namespace

sapipe_status run_group_collective(Link& link, const CollectiveArgs& args, Deadline deadline, int64_t* non_finite,
                                   std::string* detail) {
  sapipe_status status = SAPIPE_OK;
  *non_finite = 0;
  {
    std::lock_guard<std::mutex> lock(link.mutex);
    if (link.broken != SAPIPE_OK) {
      status = link.broken;
      *detail = link.broken_detail;
      return status;
    }
  }
  try {
    PluginTransport t = link.over(SAPIPE_COMM_CHANNEL_COLLECTIVE, detail);
    if (t.size() == 1) {
      status = run_collective(t, args, deadline, non_finite);
    } else {
      Header mine{static_cast<uint64_t>(args.kind), args.input_count, args.output_count, static_cast<uint64_t>(args.root), 0, 0, 0, {}};
      SharedRegions::Use use;
      // direct_disabled is the same on every rank (see prepare_direct).
      if (link.direct_allowed && link.all_local && !link.direct_disabled && reads_peers(args.kind)) use = link.regions->find(args.input, args.input_count * sizeof(float));
      mine.region = use.id;
      mine.offset = use.offset;
      mine.key_bytes = use.key.size();
      const std::vector<uint64_t> freed = link.regions->take_freed(kFreedPerHeader);
      std::copy(freed.begin(), freed.end(), mine.freed);
      std::vector<Header> all;
      bool clean = false;
      status = agree(t, mine, &all, detail, deadline, &clean);
      if (clean)
        for (int q = 0; q < t.size(); ++q)
          if (q != t.rank())
            for (uint64_t id : all[static_cast<size_t>(q)].freed)
              if (id != 0) link.regions->unmap(q, id);
      if (status != SAPIPE_OK) {
        // A disagreement is seen alike by every rank and leaves nothing in flight.
        if (!clean) link.break_collectives(status, *detail);
        return status;
      }
      Views views;
      bool direct = false;
      status = prepare_direct(link, t, all, mine, use.key, &direct, &views, deadline, detail);
      if (status == SAPIPE_OK && !direct) {
        status = run_collective(t, args, deadline, non_finite);
      } else if (status == SAPIPE_OK && views.empty()) {
        status = direct_abandon(t, deadline);
      } else if (status == SAPIPE_OK) {
        status = run_direct(t, args, std::move(views), deadline, non_finite);
        if (status == SAPIPE_ERR_INTERNAL && detail->empty())
          *detail = "another rank could not take part in this shared-memory collective";
        if (status == SAPIPE_OK) link.direct_runs.fetch_add(1, std::memory_order_relaxed);
      }
    }
  } catch (const std::bad_alloc&) {
    status = SAPIPE_ERR_OUT_OF_MEMORY;
    *detail = "out of memory for the collective's working copy";
  }
  if (status != SAPIPE_OK) link.break_collectives(status, *detail);
  return status;
}

}  // namespace sapipe::comm::ucx
