// LocalComm: the JS face of one rank of a local group (native/comm/local). Collectives and
// point-to-point operations run on an execution queue the caller passes (one per kind of traffic,
// so that a blocked send does not hold up a collective), and settle a Promise.
//
// A worker thread that ends (terminate(), an uncaught error, process exit) runs its environment's
// cleanup hooks: the hook below marks its rank lost, which fails every peer's pending and later
// operations with ERR_PEER_LOST instead of leaving them waiting. What an operation does when it
// runs (the group's algorithm or the ring, the fused steps' job) is native/comm/local
// (local_ops.h); this file converts arguments and owns lifetimes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../comm/local/local_ops.h"
#include "../comm/local/local_registry.h"
#include "../core/host_kernels.h"
#include "comm_local_binding.h"
#include "comm_op.h"
#include "errors.h"
#include "native_buffer.h"
#include "queue.h"
#include "update_binding.h"

namespace sapipe::addon {
namespace {

using comm::Deadline;
using comm::local::CollectiveArgs;
using comm::local::CollectiveKind;
using comm::local::Group;

// The rank's membership; the cleanup hook holds a raw pointer to it until it runs or is removed.
struct Membership {
  std::shared_ptr<Group> group;
  int rank = 0;
  napi_env env = nullptr;
  bool hook_registered = false;
  bool left = false;

  static void OnEnvCleanup(void* arg) {
    auto* m = static_cast<Membership*>(arg);
    m->hook_registered = false;
    m->group->leave(m->rank, /*lost=*/true);
    m->left = true;
  }
  void leave(bool lost) {
    if (hook_registered) {
      napi_remove_env_cleanup_hook(env, OnEnvCleanup, this);
      hook_registered = false;
    }
    if (!left) group->leave(rank, lost);
    left = true;
  }
};

class LocalComm : public Napi::ObjectWrap<LocalComm> {
 public:
  static void Init(Napi::Env env, Napi::Object exports) {
    exports.Set("LocalComm", DefineClass(env, "LocalComm",
                                         {InstanceMethod<&LocalComm::Ready>("ready"),
                                          InstanceMethod<&LocalComm::Collective>("collective"),
                                          InstanceMethod<&LocalComm::ReduceUpdate>("reduceUpdate"),
                                          InstanceMethod<&LocalComm::UpdateFromParts>("updateFromParts"),
                                          InstanceMethod<&LocalComm::Send>("send"),
                                          InstanceMethod<&LocalComm::Recv>("recv"),
                                          InstanceMethod<&LocalComm::Destroy>("destroy")}));
  }

  explicit LocalComm(const Napi::CallbackInfo& info) : Napi::ObjectWrap<LocalComm>(info) {
    Napi::Env env = info.Env();
    if (!info[0].IsString()) throw_error(env, "ERR_INVALID_ARGUMENT", "LocalComm: the group name must be a string");
    const std::string name = info[0].As<Napi::String>().Utf8Value();
    const size_t size = index_arg(info.Env(), info[1], "size"), rank = index_arg(info.Env(), info[2], "rank");
    check_rank(env, "LocalComm", size, rank);
    timeout_ = arg_timeout(info, 3);
    auto m = std::make_shared<Membership>();
    std::string detail;
    sapipe_status s = comm::local::join_group(name, static_cast<int>(size), static_cast<int>(rank), &m->group, &detail);
    if (s != SAPIPE_OK) throw_detail(env, s, "LocalComm", detail);
    m->rank = static_cast<int>(rank);
    m->env = env;
    if (napi_add_env_cleanup_hook(env, Membership::OnEnvCleanup, m.get()) == napi_ok) m->hook_registered = true;
    member_ = std::move(m);
  }

  ~LocalComm() override {
    // Collected without destroy(): queued operations keep the group alive through their own
    // shared_ptr; leaving here frees the peers instead of letting them time out.
    if (member_) member_->leave(/*lost=*/true);
  }

 private:
  Membership& live(Napi::Env env, const char* op) {
    if (!member_ || member_->left)
      throw_error(env, "ERR_DISPOSED", std::string(op) + ": the communicator was destroyed; create a new one");
    return *member_;
  }
  Deadline deadline() const { return comm::Clock::now() + timeout_; }

  Napi::Value Ready(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Queue* queue = Queue::FromValue(env, info[0]);
    Membership& m = live(env, "ready");
    class ReadyOp : public CommOp {
     public:
      ReadyOp(Napi::Env env, std::shared_ptr<Membership> m, Deadline d) : CommOp(env, "join", {}), m_(std::move(m)), d_(d) {}
      void Run() override { status_ = m_->group->wait_ready(m_->rank, d_, &detail_); }
     private:
      std::shared_ptr<Membership> m_;
      Deadline d_;
    };
    (void)m;
    return queue->Submit(env, new ReadyOp(env, member_, deadline()));
  }

  // collective(queue, kind, input, inOffset, inCount, output|null, outOffset, outCount, scale, root, ring)
  Napi::Value Collective(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Queue* queue = Queue::FromValue(env, info[0]);
    live(env, "collective");
    const size_t kind = index_arg(info.Env(), info[1], "kind");
    if (kind > static_cast<size_t>(CollectiveKind::kAllgatherInPlace))
      throw_error(env, "ERR_INVALID_ARGUMENT", "collective: unknown kind");
    CollectiveArgs args;
    args.kind = static_cast<CollectiveKind>(kind);
    std::vector<BufferPtr> held;
    arg_collective(info, args, held);
    args.root = static_cast<int32_t>(index_arg(info.Env(), info[9], "root"));
    const bool ring = info[10].ToBoolean().Value();
    if (ring && args.kind != CollectiveKind::kAllreduce)
      throw_error(env, "ERR_INVALID_ARGUMENT", "collective: the ring algorithm is offered for allreduce only");
    // No busy() check: buckets of one gradient buffer are queued back to back while earlier
    // buckets are still reduced or updated; each operation holds its buffers against dispose().

    class CollectiveOp : public CommOp {
     public:
      CollectiveOp(Napi::Env env, std::vector<BufferPtr> held, std::shared_ptr<Membership> m, CollectiveArgs a,
                   Deadline d, bool ring)
          : CommOp(env, "collective", std::move(held)), m_(std::move(m)), a_(a), d_(d), ring_(ring) {}
      void Run() override { status_ = comm::local::run_collective(m_->group, m_->rank, a_, ring_, d_, &non_finite_, &detail_); }
      Napi::Value Value(Napi::Env env) override { return Napi::Number::New(env, static_cast<double>(non_finite_)); }
     private:
      std::shared_ptr<Membership> m_;
      CollectiveArgs a_;
      Deadline d_;
      bool ring_;
      int64_t non_finite_ = 0;
    };
    return queue->Submit(env, new CollectiveOp(env, std::move(held), member_, args, deadline(), ring));
  }

  // reduceUpdate(queue, config, buffers, scale): the sharded mode's fused step (kReduceUpdate) over
  // buffers' [offset, offset + count). The caller has established that the reduced gradient is
  // finite (the prescan), since blocks are updated as they are reduced.
  Napi::Value ReduceUpdate(const Napi::CallbackInfo& info) { return SubmitUpdateJob(info, CollectiveKind::kReduceUpdate); }

  // updateFromParts(queue, config, buffers): the replicated fused step's second pass
  // (kUpdateFromParts) over buffers' [offset, offset + count), after a reduceScatterInPlace of the
  // same range found every sum finite.
  Napi::Value UpdateFromParts(const Napi::CallbackInfo& info) { return SubmitUpdateJob(info, CollectiveKind::kUpdateFromParts); }

  Napi::Value SubmitUpdateJob(const Napi::CallbackInfo& info, CollectiveKind kind) {
    Napi::Env env = info.Env();
    const bool sharded = kind == CollectiveKind::kReduceUpdate;
    const char* what = sharded ? "reduceUpdate" : "updateFromParts";
    Queue* queue = Queue::FromValue(env, info[0]);
    live(env, what);
    auto job = std::make_shared<comm::local::ReduceUpdateJob>();
    ParsedUpdate parsed = parse_update(env, info[1], info[2]);
    CollectiveArgs args;
    std::string detail;
    if (sapipe_status s = comm::local::prepare_update_job(kind, parsed.config, parsed.buffers, job.get(), &args, &detail); s != SAPIPE_OK)
      throw_detail(env, s, what, detail);
    if (sharded) {
      if (!info[3].IsNumber()) throw_error(env, "ERR_INVALID_ARGUMENT", "reduceUpdate: scale must be a number");
      args.scale = info[3].As<Napi::Number>().FloatValue();
      if (!std::isfinite(args.scale)) throw_error(env, "ERR_INVALID_ARGUMENT", "reduceUpdate: scale must be finite");
    }

    class ReduceUpdateOp : public CommOp {
     public:
      ReduceUpdateOp(Napi::Env env, const char* what, std::vector<BufferPtr> held, std::shared_ptr<Membership> m,
                     std::shared_ptr<comm::local::ReduceUpdateJob> job, CollectiveArgs a, Deadline d)
          : CommOp(env, what, std::move(held)), m_(std::move(m)), job_(std::move(job)), a_(a), d_(d) {}
      void Run() override { status_ = m_->group->collective(m_->rank, a_, d_, &non_finite_, &detail_); }
      Napi::Value Value(Napi::Env env) override { return Napi::Number::New(env, static_cast<double>(non_finite_)); }
     private:
      std::shared_ptr<Membership> m_;
      std::shared_ptr<comm::local::ReduceUpdateJob> job_;  // peers read it during the collective
      CollectiveArgs a_;
      Deadline d_;
      int64_t non_finite_ = 0;
    };
    return queue->Submit(env, new ReduceUpdateOp(env, what, std::move(parsed.held), member_, job, args, deadline()));
  }

  // send(queue, buffer, offset, count, peer) / recv(queue, buffer, offset, count, peer)
  Napi::Value PointToPoint(const Napi::CallbackInfo& info, bool send) {
    Napi::Env env = info.Env();
    const char* op = send ? "send" : "recv";
    Queue* queue = Queue::FromValue(env, info[0]);
    Membership& m = live(env, op);
    Range r = arg_range(info, 1, "buffer");
    const size_t peer = index_arg(info.Env(), info[4], "peer");
    if (peer >= static_cast<size_t>(m.group->size()) || static_cast<int>(peer) == m.rank)
      throw_error(env, "ERR_INVALID_ARGUMENT", std::string(op) + ": peer must be another rank of the group");
    class P2POp : public CommOp {
     public:
      P2POp(Napi::Env env, const char* name, Range r, std::shared_ptr<Membership> m, int peer, Deadline d, bool send)
          : CommOp(env, name, {r.buffer}), r_(std::move(r)), m_(std::move(m)), peer_(peer), d_(d), send_(send) {}
      void Run() override {
        status_ = send_ ? comm::local::send_to_peer(*m_->group, m_->rank, peer_, r_.data(), r_.count, d_, &detail_)
                        : comm::local::recv_from_peer(*m_->group, m_->rank, peer_, r_.data(), r_.count, d_, &detail_);
      }
     private:
      Range r_;
      std::shared_ptr<Membership> m_;
      int peer_;
      Deadline d_;
      bool send_;
    };
    return queue->Submit(env, new P2POp(env, op, std::move(r), member_, static_cast<int>(peer), deadline(), send));
  }
  Napi::Value Send(const Napi::CallbackInfo& info) { return PointToPoint(info, true); }
  Napi::Value Recv(const Napi::CallbackInfo& info) { return PointToPoint(info, false); }

  Napi::Value Destroy(const Napi::CallbackInfo& info) {
    if (member_) member_->leave(/*lost=*/false);
    return info.Env().Undefined();
  }

  std::shared_ptr<Membership> member_;
  std::chrono::milliseconds timeout_{30000};
};

// dst = src on the calling thread alone: the per-core bandwidth a rank of the local backend has.
Napi::Value CopySingleThread(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  BufferPtr dst = NativeBuffer::FromValue(env, info[0], "dst"), src = NativeBuffer::FromValue(env, info[1], "src");
  if (dst->size() != src->size()) throw_error(env, "ERR_SIZE_MISMATCH", "copySingleThread: the buffers differ in length");
  if (dst == src) throw_error(env, "ERR_ALIASING", "copySingleThread: dst and src must be different buffers");
  if (dst->busy() || src->busy()) throw_error(env, "ERR_BUSY", "copySingleThread: a buffer is in use by a pending operation");
  core::host_kernels().copy(dst->data(), src->data(), dst->size());
  return env.Undefined();
}

}  // namespace

void InitCommLocal(Napi::Env env, Napi::Object exports) {
  LocalComm::Init(env, exports);
  exports.Set("copySingleThread", Napi::Function::New(env, CopySingleThread, "copySingleThread"));
}

}  // namespace sapipe::addon
