// UcxComm: the JS face of one rank over the UCX transport plugin (sapipe_ucx.so, opened on first
// use so that the addon loads where UCX is absent). The rank's worker address is handed to JS,
// which swaps addresses through the rendezvous store and passes them all to connect().
//
// Collectives run on one execution queue and point-to-point operations on others (one per peer
// and direction), all sharing the plugin's worker (the plugin serialises access to it). How an
// operation runs (connecting, the collectives' header agreement, shared regions, ring or direct,
// the user's messages) is the group protocol of native/comm/ucx/ucx_group.h; this file converts
// arguments and owns lifetimes.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "../comm/ucx/ucx_group.h"
#include "../core/plugin_loader.h"
#include "comm_op.h"
#include "comm_ucx_binding.h"

namespace sapipe::addon {
namespace {

using comm::Deadline;
using comm::CollectiveArgs;
using comm::CollectiveKind;
using comm::ucx::Link;
using comm::ucx::SharedRegions;

const sapipe_comm_plugin_v1* plugin_or_null(std::string* reason) {
  const PluginLoad& load = ucx_plugin();
  if (load.table == nullptr) {
    *reason = load.reason;
    return nullptr;
  }
  return reinterpret_cast<const sapipe_comm_plugin_v1*>(load.table);
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
    std::vector<int32_t> remote_flags;
    for (uint32_t r = 0; r < n; ++r) {
      Napi::Value v = list.Get(r);
      if (!v.IsBuffer()) throw_error(env, "ERR_INVALID_ARGUMENT", "connect: addresses must be Buffers");
      auto b = v.As<Napi::Buffer<uint8_t>>();
      addresses.emplace_back(b.Data(), b.Data() + b.Length());
      remote_flags.push_back(remote.Get(r).ToBoolean().Value() ? 1 : 0);
    }
    l.all_local = comm::ucx::all_local(remote_flags);  // read by collectives, which are queued after this
    class ConnectOp : public CommOp {
     public:
      ConnectOp(Napi::Env env, std::shared_ptr<Link> l, std::vector<std::vector<uint8_t>> a, std::vector<int32_t> remote, Deadline d)
          : CommOp(env, "connect", {}), l_(std::move(l)), a_(std::move(a)), remote_(std::move(remote)), d_(d) {}
      void Run() override { status_ = comm::ucx::connect_link(*l_, a_, remote_, d_, &detail_); }
     private:
      std::shared_ptr<Link> l_;
      std::vector<std::vector<uint8_t>> a_;
      std::vector<int32_t> remote_;
      Deadline d_;
    };
    return queue->Submit(env, new ConnectOp(env, link_, std::move(addresses), std::move(remote_flags), deadline()));
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
      void Run() override { status_ = comm::ucx::run_group_collective(*l_, a_, d_, &non_finite_, &detail_); }
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
        status_ = send_ ? comm::ucx::send_to_peer(*l_, peer_, r_.data(), r_.count, d_, &detail_)
                        : comm::ucx::recv_from_peer(*l_, peer_, r_.data(), r_.count, d_, &detail_);
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
