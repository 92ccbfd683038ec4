// UcxComm: the JS face of one rank over the UCX transport plugin (sapipe_ucx.so, opened on first
// use so that the addon loads where UCX is absent). The rank's worker address is handed to JS,
// which swaps addresses through the rendezvous store and passes them all to connect().
//
// Collectives run on one execution queue and point-to-point operations on others (one per peer
// and direction), all sharing the plugin's worker (the plugin serialises access to it). Every
// collective first swaps a small header (kind, sizes, root) around the ring, so that ranks that
// disagree all fail alike with ERR_SIZE_MISMATCH before any data moves; a collective that fails
// after that (a lost peer, a timeout) leaves the ranks out of step, so later collectives fail at
// once with the same error.
//
// Buffers from allocate() lie in shared regions (shared_regions.h). When every rank of a
// collective passes such a buffer and all ranks run on one machine, the collective reads the
// peers' buffers directly (native/comm/direct.h) instead of sending the bytes around the ring.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "../comm/direct.h"
#include "../comm/collective.h"
#include "../comm/plugin_transport.h"
#include "../comm/ring.h"
#include "../core/plugin_loader.h"
#include "comm_op.h"
#include "comm_ucx_binding.h"
#include "shared_regions.h"

namespace sapipe::addon {
namespace {

using comm::Deadline;
using comm::CollectiveArgs;
using comm::CollectiveKind;

const sapipe_comm_plugin_v1* plugin_or_null(std::string* reason) {
  const PluginLoad& load = ucx_plugin();
  if (load.table == nullptr) {
    *reason = load.reason;
    return nullptr;
  }
  return reinterpret_cast<const sapipe_comm_plugin_v1*>(load.table);
}

// One rank's transport, shared by the UcxComm and its queued operations; the last owner closes it.
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

  ~Link() {
    if (transport == nullptr) return;
    if (regions) regions->unmap_all();
    plugin->destroy(transport);
  }
  comm::PluginTransport over(int channel, std::string* detail) {
    return comm::PluginTransport(plugin, transport, rank, size, channel, chunk_count, detail);
  }
  void break_collectives(sapipe_status s, const std::string& detail) {
    std::lock_guard<std::mutex> lock(mutex);
    if (broken != SAPIPE_OK) return;
    broken = s;
    broken_detail = "an earlier collective failed, so the ranks are out of step: " + detail;
  }
};

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

sapipe_status agree(comm::Transport& t, const Header& mine, std::vector<Header>* all, std::string* detail, Deadline deadline,
                    bool* clean) {
  *clean = false;
  const int n = t.size();
  std::vector<float> wire(static_cast<size_t>(n) * kHeaderFloats);
  std::memcpy(wire.data() + static_cast<size_t>(t.rank()) * kHeaderFloats, &mine, sizeof mine);
  if (sapipe_status s = comm::ring_allgather_blocks(t, wire.data(), kHeaderFloats, deadline); s != SAPIPE_OK) return s;
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
sapipe_status prepare_direct(Link& l, comm::Transport& t, const std::vector<Header>& headers, const Header& mine,
                             const std::vector<uint8_t>& my_key, bool* direct, comm::Views* views, Deadline deadline,
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
    if (sapipe_status s = comm::ring_allgather_blocks(t, keys.data(), block, deadline); s != SAPIPE_OK) return s;
    bool mapped = true;
    std::string why;
    for (int q = 0; q < n && mapped; ++q) {
      const Header& h = headers[static_cast<size_t>(q)];
      if (q == r || h.key_bytes == 0) continue;
      mapped = l.regions->map(q, h.region, reinterpret_cast<const uint8_t*>(keys.data() + static_cast<size_t>(q) * block),
                              h.key_bytes, &why);
    }
    std::vector<int64_t> all_mapped;
    if (sapipe_status s = comm::exchange_all(t, mapped ? 1 : 0, &all_mapped, deadline); s != SAPIPE_OK) return s;
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

sapipe_status run_direct(comm::Transport& t, const CollectiveArgs& a, comm::Views views, Deadline d, int64_t* non_finite) {
  views[static_cast<size_t>(t.rank())] = a.input;
  *non_finite = 0;
  switch (a.kind) {
    case CollectiveKind::kAllreduce:
      return comm::direct_allreduce(t, views, a.input_count, a.scale, d, non_finite);
    case CollectiveKind::kReduceScatter:
      return comm::direct_reduce_scatter_blocks(t, views, a.output_count, a.output, a.scale, d, non_finite);
    case CollectiveKind::kAllgather:
      return comm::direct_allgather_blocks(t, views, a.input_count, a.output, d);
    case CollectiveKind::kBroadcast:
      return comm::direct_broadcast(t, views, a.input_count, a.root, d);
    case CollectiveKind::kReduceScatterInPlace:
      return comm::direct_reduce_scatter(t, views, a.input_count, a.scale, d, non_finite);
    case CollectiveKind::kAllgatherInPlace:
      return comm::direct_allgather(t, views, a.input_count, d);
    default:
      return SAPIPE_ERR_INVALID_ARGUMENT;
  }
}

sapipe_status run_collective(comm::Transport& t, const CollectiveArgs& a, Deadline d, int64_t* non_finite) {
  const int n = t.size(), r = t.rank();
  *non_finite = 0;
  switch (a.kind) {
    case CollectiveKind::kBarrier:
      return SAPIPE_OK;  // the header swap was the barrier: every rank has sent its header
    case CollectiveKind::kAllreduce:
      return comm::ring_allreduce(t, a.input, a.input_count, a.scale, d, non_finite);
    case CollectiveKind::kReduceScatter: {
      // The ring reduces in place and leaves partial sums in the other parts: work on a copy so
      // the caller's input stays as it was.
      const size_t m = a.output_count;
      std::vector<float> work(a.input, a.input + a.input_count);
      sapipe_status s = comm::ring_reduce_scatter_blocks(t, work.data(), m, a.scale, d, non_finite);
      if (s == SAPIPE_OK && m > 0) std::memcpy(a.output, work.data() + static_cast<size_t>(r) * m, m * sizeof(float));
      return s;
    }
    case CollectiveKind::kAllgather: {
      const size_t m = a.input_count;
      if (m > 0) std::memcpy(a.output + static_cast<size_t>(r) * m, a.input, m * sizeof(float));
      return n == 1 ? SAPIPE_OK : comm::ring_allgather_blocks(t, a.output, m, d);
    }
    case CollectiveKind::kBroadcast:
      return comm::ring_broadcast(t, a.input, a.input_count, a.root, d);
    case CollectiveKind::kReduceScatterInPlace:
      return comm::ring_reduce_scatter(t, a.input, a.input_count, a.scale, d, non_finite);
    case CollectiveKind::kAllgatherInPlace:
      return comm::ring_allgather(t, a.input, a.input_count, d);
    default:
      return SAPIPE_ERR_INVALID_ARGUMENT;
  }
}

class UcxComm : public Napi::ObjectWrap<UcxComm> {
 public:
  static void Init(Napi::Env env, Napi::Object exports) {
    exports.Set("UcxComm", DefineClass(env, "UcxComm",
                                       {InstanceMethod<&UcxComm::Address>("address"),
                                        InstanceMethod<&UcxComm::Connect>("connect"),
                                        InstanceMethod<&UcxComm::Allocate>("allocate"),
                                        InstanceMethod<&UcxComm::DirectRuns>("directRuns"),
                                        InstanceMethod<&UcxComm::Collective>("collective"),
                                        InstanceMethod<&UcxComm::Send>("send"),
                                        InstanceMethod<&UcxComm::Recv>("recv"),
                                        InstanceMethod<&UcxComm::PeerLost>("peerLost"),
                                        InstanceMethod<&UcxComm::Destroy>("destroy")}));
  }

  // new UcxComm(rank, size, timeoutMs, chunkElements, direct)
  explicit UcxComm(const Napi::CallbackInfo& info) : Napi::ObjectWrap<UcxComm>(info) {
    Napi::Env env = info.Env();
    const size_t rank = index_arg(info.Env(), info[0], "rank"), size = index_arg(info.Env(), info[1], "size");
    check_rank(env, "UcxComm", size, rank);
    timeout_ = arg_timeout(info, 2);
    const size_t chunk = index_arg(info.Env(), info[3], "chunkElements");
    std::string reason;
    const sapipe_comm_plugin_v1* plugin = plugin_or_null(&reason);
    if (plugin == nullptr) throw_error(env, "ERR_BACKEND_UNAVAILABLE", "the ucx backend is unavailable: " + reason);
    auto link = std::make_shared<Link>();
    link->plugin = plugin;
    link->rank = static_cast<int>(rank);
    link->size = static_cast<int>(size);
    link->chunk_count = chunk;
    link->direct_allowed = info[4].ToBoolean().Value();
    sapipe_status s = plugin->create(static_cast<int32_t>(rank), static_cast<int32_t>(size), &link->transport);
    if (s != SAPIPE_OK) throw_detail(env, s, "UcxComm", plugin->last_error());
    link->regions = std::make_shared<SharedRegions>(plugin, link->transport);
    link_ = std::move(link);
  }

  ~UcxComm() override {
    // Collected without destroy(): queued operations keep the transport alive through their own
    // reference; shutting down makes them finish now instead of waiting for their timeouts.
    if (link_) link_->plugin->shutdown(link_->transport);
  }

 private:
  Link& live(Napi::Env env, const char* op) {
    if (!link_) throw_error(env, "ERR_DISPOSED", std::string(op) + ": the communicator was destroyed; create a new one");
    return *link_;
  }
  Deadline deadline() const { return comm::Clock::now() + timeout_; }

  Napi::Value Address(const Napi::CallbackInfo& info) {
    Link& l = live(info.Env(), "address");
    const void* address = nullptr;
    size_t bytes = 0;
    sapipe_status s = l.plugin->local_address(l.transport, &address, &bytes);
    if (s != SAPIPE_OK) throw_detail(info.Env(), s, "address", l.plugin->last_error());
    return Napi::Buffer<uint8_t>::Copy(info.Env(), static_cast<const uint8_t*>(address), bytes);
  }

  // connect(queue, addresses: Buffer[], remote: boolean[]) -> Promise<void>; remote[r]: rank r is
  // on another machine (UCX then watches it for failure; see comm.h).
  Napi::Value Connect(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Queue* queue = Queue::FromValue(env, info[0]);
    Link& l = live(env, "connect");
    const uint32_t n = static_cast<uint32_t>(l.size);
    if (!info[1].IsArray() || info[1].As<Napi::Array>().Length() != n || !info[2].IsArray() || info[2].As<Napi::Array>().Length() != n)
      throw_error(env, "ERR_INVALID_ARGUMENT", "connect: addresses and remote must be arrays of one entry per rank");
    Napi::Array list = info[1].As<Napi::Array>(), remote = info[2].As<Napi::Array>();
    std::vector<std::vector<uint8_t>> addresses;
    std::vector<int32_t> detect;
    bool all_local = true;
    for (uint32_t r = 0; r < n; ++r) {
      Napi::Value v = list.Get(r);
      if (!v.IsBuffer()) throw_error(env, "ERR_INVALID_ARGUMENT", "connect: addresses must be Buffers");
      auto b = v.As<Napi::Buffer<uint8_t>>();
      addresses.emplace_back(b.Data(), b.Data() + b.Length());
      detect.push_back(remote.Get(r).ToBoolean().Value() ? 1 : 0);
      if (detect.back() != 0) all_local = false;
    }
    l.all_local = all_local;  // read by collectives, which are queued after this
    class ConnectOp : public CommOp {
     public:
      ConnectOp(Napi::Env env, std::shared_ptr<Link> l, std::vector<std::vector<uint8_t>> a, std::vector<int32_t> detect, Deadline d)
          : CommOp(env, "connect", {}), l_(std::move(l)), a_(std::move(a)), detect_(std::move(detect)), d_(d) {}
      void Run() override {
        std::vector<const void*> pointers;
        std::vector<size_t> lengths;
        for (auto& a : a_) {
          pointers.push_back(a.data());
          lengths.push_back(a.size());
        }
        status_ = l_->plugin->connect(l_->transport, pointers.data(), lengths.data(), detect_.data(), comm::deadline_ms(d_));
        if (status_ != SAPIPE_OK) detail_ = l_->plugin->last_error();
      }
     private:
      std::shared_ptr<Link> l_;
      std::vector<std::vector<uint8_t>> a_;
      std::vector<int32_t> detect_;
      Deadline d_;
    };
    return queue->Submit(env, new ConnectOp(env, link_, std::move(addresses), std::move(detect), deadline()));
  }

  // allocate(length) -> NativeBuffer in a shared region (see shared_regions.h).
  Napi::Value Allocate(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Link& l = live(env, "allocate");
    const size_t length = index_arg(info.Env(), info[0], "length");
    if (length > 4294967295u) throw_error(env, "ERR_INVALID_ARGUMENT", "allocate: length must be an integer in [0, 2^32 - 1]");
    sapipe_status status = SAPIPE_OK;
    std::string detail;
    std::shared_ptr<AlignedBuffer> buffer = l.regions->allocate(length, &status, &detail);
    if (!buffer) throw_detail(env, status, "allocate", detail);
    return NativeBuffer::Wrap(env, std::move(buffer));
  }

  Napi::Value DirectRuns(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), link_ ? static_cast<double>(link_->direct_runs.load(std::memory_order_relaxed)) : direct_runs_at_destroy_);
  }

  // collective(queue, kind, input, inOffset, inCount, output|null, outOffset, outCount, scale, root) -> Promise<nonFinite>
  Napi::Value Collective(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Queue* queue = Queue::FromValue(env, info[0]);
    Link& l = live(env, "collective");
    const size_t kind = index_arg(info.Env(), info[1], "kind");
    // Every kind but the local backend's fused kReduceUpdate (the ucx backend composes the sharded
    // update from the in-place shard collectives instead).
    if (kind > static_cast<size_t>(CollectiveKind::kAllgatherInPlace)) throw_error(env, "ERR_INVALID_ARGUMENT", "collective: unknown kind");
    CollectiveArgs args;
    args.kind = static_cast<CollectiveKind>(kind);
    std::vector<BufferPtr> held;
    arg_collective(info, args, held);
    if (args.kind == CollectiveKind::kReduceScatter || args.kind == CollectiveKind::kAllgather) {
      const bool rs = args.kind == CollectiveKind::kReduceScatter;
      const size_t whole = rs ? args.input_count : args.output_count, part = rs ? args.output_count : args.input_count;
      if (whole != part * static_cast<size_t>(l.size))
        throw_error(env, "ERR_SIZE_MISMATCH", "collective: the larger buffer must hold size x the smaller one's elements");
    }
    const size_t root = index_arg(info.Env(), info[9], "root");
    if (root >= static_cast<size_t>(l.size)) throw_error(env, "ERR_INVALID_ARGUMENT", "collective: root must be a rank of the group");
    args.root = static_cast<int32_t>(root);

    class CollectiveOp : public CommOp {
     public:
      CollectiveOp(Napi::Env env, std::vector<BufferPtr> held, std::shared_ptr<Link> l, CollectiveArgs a, Deadline d)
          : CommOp(env, "collective", std::move(held)), l_(std::move(l)), a_(a), d_(d) {}
      void Run() override {
        {
          std::lock_guard<std::mutex> lock(l_->mutex);
          if (l_->broken != SAPIPE_OK) {
            status_ = l_->broken;
            detail_ = l_->broken_detail;
            return;
          }
        }
        try {
          comm::PluginTransport t = l_->over(SAPIPE_COMM_CHANNEL_COLLECTIVE, &detail_);
          if (t.size() == 1) {
            status_ = run_collective(t, a_, d_, &non_finite_);
          } else {
            Header mine{static_cast<uint64_t>(a_.kind), a_.input_count, a_.output_count, static_cast<uint64_t>(a_.root), 0, 0, 0, {}};
            SharedRegions::Use use;
            // direct_disabled is the same on every rank (see prepare_direct).
            if (l_->direct_allowed && l_->all_local && !l_->direct_disabled && reads_peers(a_.kind)) use = l_->regions->find(a_.input, a_.input_count * sizeof(float));
            mine.region = use.id;
            mine.offset = use.offset;
            mine.key_bytes = use.key.size();
            const std::vector<uint64_t> freed = l_->regions->take_freed(kFreedPerHeader);
            std::copy(freed.begin(), freed.end(), mine.freed);
            std::vector<Header> all;
            bool clean = false;
            status_ = agree(t, mine, &all, &detail_, d_, &clean);
            if (clean)
              for (int q = 0; q < t.size(); ++q)
                if (q != t.rank())
                  for (uint64_t id : all[static_cast<size_t>(q)].freed)
                    if (id != 0) l_->regions->unmap(q, id);
            if (status_ != SAPIPE_OK) {
              // A disagreement is seen alike by every rank and leaves nothing in flight.
              if (!clean) l_->break_collectives(status_, detail_);
              return;
            }
            comm::Views views;
            bool direct = false;
            status_ = prepare_direct(*l_, t, all, mine, use.key, &direct, &views, d_, &detail_);
            if (status_ == SAPIPE_OK && !direct) {
              status_ = run_collective(t, a_, d_, &non_finite_);
            } else if (status_ == SAPIPE_OK && views.empty()) {
              status_ = comm::direct_abandon(t, d_);
            } else if (status_ == SAPIPE_OK) {
              status_ = run_direct(t, a_, std::move(views), d_, &non_finite_);
              if (status_ == SAPIPE_ERR_INTERNAL && detail_.empty())
                detail_ = "another rank could not take part in this shared-memory collective";
              if (status_ == SAPIPE_OK) l_->direct_runs.fetch_add(1, std::memory_order_relaxed);
            }
          }
        } catch (const std::bad_alloc&) {
          status_ = SAPIPE_ERR_OUT_OF_MEMORY;
          detail_ = "out of memory for the collective's working copy";
        }
        if (status_ != SAPIPE_OK) l_->break_collectives(status_, detail_);
      }
      Napi::Value Value(Napi::Env env) override { return Napi::Number::New(env, static_cast<double>(non_finite_)); }
     private:
      std::shared_ptr<Link> l_;
      CollectiveArgs a_;
      Deadline d_;
      int64_t non_finite_ = 0;
    };
    return queue->Submit(env, new CollectiveOp(env, std::move(held), link_, args, deadline()));
  }

  // send(queue, buffer, offset, count, peer) / recv(queue, buffer, offset, count, peer)
  Napi::Value PointToPoint(const Napi::CallbackInfo& info, bool send) {
    Napi::Env env = info.Env();
    const char* op = send ? "send" : "recv";
    Queue* queue = Queue::FromValue(env, info[0]);
    Link& l = live(env, op);
    Range r = arg_range(info, 1, "buffer");
    const size_t peer = index_arg(info.Env(), info[4], "peer");
    if (peer >= static_cast<size_t>(l.size) || static_cast<int>(peer) == l.rank)
      throw_error(env, "ERR_INVALID_ARGUMENT", std::string(op) + ": peer must be another rank of the group");
    class P2POp : public CommOp {
     public:
      P2POp(Napi::Env env, const char* name, Range r, std::shared_ptr<Link> l, int peer, Deadline d, bool send)
          : CommOp(env, name, {r.buffer}), r_(std::move(r)), l_(std::move(l)), peer_(peer), d_(d), send_(send) {}
      void Run() override {
        const sapipe_comm_plugin_v1* p = l_->plugin;
        const size_t bytes = r_.count * sizeof(float);
        if (send_) {
          // Synchronous: the send completes once the peer has taken the message (the buffer may
          // then be reused, and the peer has really received it, as Communicator.send promises).
          sapipe_comm_request* request = nullptr;
          status_ = p->isend(l_->transport, peer_, SAPIPE_COMM_CHANNEL_USER, 1, r_.data(), bytes, &request);
          if (status_ == SAPIPE_OK) status_ = p->wait_send(l_->transport, request, comm::deadline_ms(d_));
        } else {
          status_ = p->recv(l_->transport, peer_, SAPIPE_COMM_CHANNEL_USER, r_.data(), bytes, comm::deadline_ms(d_));
        }
        if (status_ != SAPIPE_OK) detail_ = p->last_error();
      }
     private:
      Range r_;
      std::shared_ptr<Link> l_;
      int peer_;
      Deadline d_;
      bool send_;
    };
    return queue->Submit(env, new P2POp(env, op, std::move(r), link_, static_cast<int>(peer), deadline(), send));
  }
  Napi::Value Send(const Napi::CallbackInfo& info) { return PointToPoint(info, true); }
  Napi::Value Recv(const Napi::CallbackInfo& info) { return PointToPoint(info, false); }

  // peerLost(peer, reason): the liveness signal the TypeScript side watches (a closed socket).
  Napi::Value PeerLost(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const size_t peer = index_arg(info.Env(), info[0], "peer");
    const std::string reason = info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : std::string("reported lost");
    if (link_ && peer < static_cast<size_t>(link_->size)) link_->plugin->peer_lost(link_->transport, static_cast<int32_t>(peer), reason.c_str());
    return env.Undefined();
  }

  Napi::Value Destroy(const Napi::CallbackInfo& info) {
    if (link_) {
      link_->plugin->shutdown(link_->transport);
      direct_runs_at_destroy_ = static_cast<double>(link_->direct_runs.load(std::memory_order_relaxed));
      link_.reset();  // the last queued operation to finish closes the endpoints
    }
    return info.Env().Undefined();
  }

  std::shared_ptr<Link> link_;
  std::chrono::milliseconds timeout_{30000};
  double direct_runs_at_destroy_ = 0;
};

// {available, reason?, pluginPath, library?}; never throws.
Napi::Value UcxStatus(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  std::string reason;
  const sapipe_comm_plugin_v1* plugin = plugin_or_null(&reason);
  out.Set("pluginPath", ucx_plugin().path);
  out.Set("available", plugin != nullptr);
  if (plugin == nullptr)
    out.Set("reason", reason);
  else
    out.Set("library", plugin->library_version());
  return out;
}

}  // namespace

void InitCommUcx(Napi::Env env, Napi::Object exports) {
  UcxComm::Init(env, exports);
  exports.Set("ucxStatus", Napi::Function::New(env, UcxStatus, "ucxStatus"));
}

}  // namespace sapipe::addon
