// NcclComm: one rank's NCCL communicator, seen from JS. Operations run on an ExecutionQueue's
// worker thread: each enqueues its NCCL calls (through the CUDA plugin's table) on the
// communicator's streams and then waits for them with the watchdog of
// native/comm/nccl/nccl_watchdog.h, which aborts the communicator instead of hanging when a peer
// dies. This file converts arguments and owns lifetimes.
#include "comm_nccl_binding.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../comm/nccl/nccl_watchdog.h"
#include "cuda_binding.h"
#include "cuda_buffer.h"
#include "errors.h"
#include "js_args.h"
#include "native_buffer.h"
#include "queue.h"
#include "sapipe/plugin.h"
#include "update_binding.h"

namespace sapipe::addon {
namespace {

using comm::nccl::Clock;
using comm::nccl::NcclState;
using comm::nccl::Outcome;
using comm::nccl::failed;
using comm::nccl::usable;
using comm::nccl::wait_for;

// Every operation: holds the state and the device memory it uses (busy while queued).
class NcclOp : public AsyncOp {
 public:
  NcclOp(Napi::Env env, std::shared_ptr<NcclState> st, std::vector<std::shared_ptr<DeviceAllocation>> held)
      : AsyncOp(env), st_(std::move(st)), held_(std::move(held)) {
    for (auto& m : held_) m->users.fetch_add(1);
    st_->in_flight.fetch_add(1);
  }
  ~NcclOp() override {
    release();
    st_->in_flight.fetch_sub(1);
  }
  bool Failed() const override { return outcome_.status != SAPIPE_OK; }
  void Run() override {
    deadline_ = Clock::now() + std::chrono::milliseconds(st_->timeout_ms);
    outcome_ = RunOn();
    // destroy() while this was queued or running: it was left to this thread to abort.
    if (st_->destroy_requested.load()) {
      std::lock_guard<std::mutex> lock(st_->mutex);
      st_->release_locked("destroyed");
    }
  }
  Napi::Value Result(Napi::Env env) override {
    release();  // the continuation may dispose the buffers
    if (outcome_.status != SAPIPE_OK) {
      Napi::Error e = Napi::Error::New(env, outcome_.message);
      e.Set("code", Napi::String::New(env, sapipe_status_code(outcome_.status)));
      throw e;
    }
    return Value(env);
  }

 protected:
  virtual Outcome RunOn() = 0;
  virtual Napi::Value Value(Napi::Env env) { return env.Undefined(); }
  std::shared_ptr<NcclState> st_;
  Clock::time_point deadline_;

 private:
  void release() {
    for (auto& m : held_) m->users.fetch_sub(1);
    held_.clear();
  }
  std::vector<std::shared_ptr<DeviceAllocation>> held_;
  Outcome outcome_;
};

class InitOp : public NcclOp {
 public:
  InitOp(Napi::Env env, std::shared_ptr<NcclState> st, const uint8_t* id) : NcclOp(env, std::move(st), {}) {
    std::memcpy(id_, id, sizeof id_);
  }

 protected:
  Outcome RunOn() override {
    const sapipe_cuda_plugin_v1* cuda = st_->cuda;
    if (cuda->set_device(st_->device) != SAPIPE_OK) return failed(SAPIPE_ERR_BACKEND_UNAVAILABLE, cuda->last_error());
    void* comm_stream = nullptr;
    void* compute_stream = nullptr;
    void* word = nullptr;
    if (cuda->stream_create(&comm_stream) != SAPIPE_OK || cuda->stream_create(&compute_stream) != SAPIPE_OK ||
        cuda->malloc_device(&word, sizeof(int64_t)) != SAPIPE_OK) {
      Outcome out = failed(SAPIPE_ERR_INTERNAL, cuda->last_error());
      if (comm_stream) cuda->stream_destroy(comm_stream);
      if (compute_stream) cuda->stream_destroy(compute_stream);
      return out;
    }
    // Blocks until every rank has joined: the caller made sure they are all alive (a store
    // barrier just before), as NCCL's blocking init cannot be given a deadline.
    void* comm = nullptr;
    const sapipe_status s = cuda->nccl_comm_init_rank(&comm, st_->size, id_, st_->rank);
    std::lock_guard<std::mutex> lock(st_->mutex);
    st_->comm_stream = comm_stream;
    st_->compute_stream = compute_stream;
    st_->count_word = static_cast<int64_t*>(word);
    if (s != SAPIPE_OK) {
      Outcome out = failed(s, std::string("ncclCommInitRank: ") + cuda->last_error());
      st_->release_locked(out.message);
      return out;
    }
    st_->comm = comm;
    return {};
  }

 private:
  uint8_t id_[SAPIPE_NCCL_UNIQUE_ID_BYTES];
};

enum CollectiveKind { kAllReduce = 0, kReduceScatter = 1, kAllGather = 2, kBroadcast = 3, kSend = 4, kRecv = 5 };

struct CollectiveArgs {
  int kind = 0;
  float* a = nullptr;
  float* b = nullptr;
  size_t count = 0;
  int32_t arg = 0;  // op, root or peer
};

// Reductions resolve with the non-finite count of their result (as the host backends do, which
// count while reducing); NCCL does not count, so a count kernel follows on the same stream.
bool counts_result(int kind) { return kind == kAllReduce || kind == kReduceScatter; }

class CollectiveOp : public NcclOp {
 public:
  CollectiveOp(Napi::Env env, std::shared_ptr<NcclState> st, std::vector<std::shared_ptr<DeviceAllocation>> held, CollectiveArgs args)
      : NcclOp(env, std::move(st), std::move(held)), args_(args) {}

 protected:
  Outcome RunOn() override {
    void* comm = nullptr;
    if (Outcome u = usable(*st_, &comm); u.status != SAPIPE_OK) return u;
    const sapipe_cuda_plugin_v1* c = st_->cuda;
    void* s = st_->comm_stream;
    const CollectiveArgs& x = args_;
    sapipe_status status = SAPIPE_OK;
    const char* what = "";
    switch (x.kind) {
      case kAllReduce: status = c->nccl_all_reduce(comm, x.a, x.a, x.count, x.arg, s), what = "allreduce"; break;
      case kReduceScatter: status = c->nccl_reduce_scatter(comm, x.a, x.b, x.count, x.arg, s), what = "reduceScatter"; break;
      case kAllGather: status = c->nccl_all_gather(comm, x.a, x.b, x.count, s), what = "allgather"; break;
      case kBroadcast: status = c->nccl_broadcast(comm, x.a, x.a, x.count, x.arg, s), what = "broadcast"; break;
      case kSend: status = c->nccl_send(comm, x.a, x.count, x.arg, s), what = "send"; break;
      case kRecv: status = c->nccl_recv(comm, x.a, x.count, x.arg, s), what = "recv"; break;
      default: return failed(SAPIPE_ERR_INVALID_ARGUMENT, "unknown collective");
    }
    if (status != SAPIPE_OK) return failed(status, std::string(what) + ": " + c->last_error());
    if (counts_result(x.kind)) {
      float* result = x.kind == kAllReduce ? x.a : x.b;
      if (c->count_non_finite(result, x.count, st_->count_word, s) != SAPIPE_OK)
        return failed(SAPIPE_ERR_INTERNAL, std::string(what) + ": " + c->last_error());
    }
    if (Outcome w = wait_for(*st_, comm, {s}, deadline_, what); w.status != SAPIPE_OK) return w;
    if (counts_result(x.kind)) {
      // The stream is idle: this copy and synchronize return at once.
      if (c->copy_to_host(&non_finite_, st_->count_word, sizeof non_finite_, s) != SAPIPE_OK || c->stream_synchronize(s) != SAPIPE_OK)
        return failed(SAPIPE_ERR_INTERNAL, std::string(what) + ": " + c->last_error());
    }
    return {};
  }
  Napi::Value Value(Napi::Env env) override { return Napi::Number::New(env, static_cast<double>(non_finite_)); }

 private:
  CollectiveArgs args_;
  int64_t non_finite_ = 0;
};

class FusedOp : public NcclOp {
 public:
  FusedOp(Napi::Env env, std::shared_ptr<NcclState> st, std::vector<std::shared_ptr<DeviceAllocation>> held,
          sapipe_update_config config, sapipe_update_buffers buffers, std::vector<size_t> buckets, bool sharded, bool recheck)
      : NcclOp(env, std::move(st), std::move(held)), config_(config), buffers_(buffers), buckets_(std::move(buckets)),
        sharded_(sharded), recheck_(recheck) {}

 protected:
  Outcome RunOn() override {
    void* comm = nullptr;
    if (Outcome u = usable(*st_, &comm); u.status != SAPIPE_OK) return u;
    const sapipe_cuda_plugin_v1* c = st_->cuda;
    const char* what = recheck_ ? "allreduceAndStep (recheck)" : "allreduceAndStep";
    const sapipe_status s =
        recheck_ ? c->nccl_fused_update_recheck(comm, &config_, &buffers_, sharded_ ? 1 : 0, st_->comm_stream, st_->compute_stream)
                 : c->nccl_fused_update(comm, &config_, &buffers_, buckets_.data(), buckets_.size(), sharded_ ? 1 : 0,
                                        st_->comm_stream, st_->compute_stream);
    if (s != SAPIPE_OK) return failed(s, std::string(what) + ": " + c->last_error());
    if (Outcome w = wait_for(*st_, comm, {st_->comm_stream, st_->compute_stream}, deadline_, what); w.status != SAPIPE_OK) return w;
    if (c->nccl_fused_update_result(comm, &result_) != SAPIPE_OK) return failed(SAPIPE_ERR_INTERNAL, c->last_error());
    return {};
  }
  Napi::Value Value(Napi::Env env) override {
    Napi::Object o = Napi::Object::New(env);
    o.Set("applied", Napi::Boolean::New(env, result_.applied != 0));
    o.Set("overflowRisk", Napi::Boolean::New(env, result_.overflow_risk != 0));
    o.Set("nonFiniteCount", Napi::Number::New(env, static_cast<double>(result_.non_finite_count)));
    return o;
  }

 private:
  sapipe_update_config config_;
  sapipe_update_buffers buffers_;
  std::vector<size_t> buckets_;
  bool sharded_, recheck_;
  sapipe_nccl_step_result result_{};
};

// A copy between host memory and device memory, queued in order with the communicator's other
// operations: the staleness-1 trainer stages a host gradient in before its fused step and the new
// weights out after it, so the whole step runs without a turn of the JavaScript thread. The host
// buffer is held busy until the copy is done (read: copied in; written: copied out).
class StageOp : public NcclOp {
 public:
  StageOp(Napi::Env env, std::shared_ptr<NcclState> st, std::shared_ptr<DeviceAllocation> device, std::shared_ptr<AlignedBuffer> host,
          size_t count, bool to_device)
      : NcclOp(env, std::move(st), {device}), device_(std::move(device)), host_(std::move(host)), count_(count), to_device_(to_device) {
    host_->acquire();
  }
  ~StageOp() override { host_->release(); }

 protected:
  Outcome RunOn() override {
    void* comm = nullptr;
    if (Outcome u = usable(*st_, &comm); u.status != SAPIPE_OK) return u;
    const sapipe_cuda_plugin_v1* c = st_->cuda;
    void* s = st_->compute_stream;
    const char* what = to_device_ ? "stage to device" : "stage to host";
    const size_t bytes = count_ * sizeof(float);
    const sapipe_status status = to_device_ ? c->copy_to_device(device_->data, host_->data(), bytes, s)
                                            : c->copy_to_host(host_->data(), device_->data, bytes, s);
    if (status != SAPIPE_OK) return failed(status, std::string(what) + ": " + c->last_error());
    return wait_for(*st_, comm, {s}, deadline_, what);
  }

 private:
  std::shared_ptr<DeviceAllocation> device_;
  std::shared_ptr<AlignedBuffer> host_;
  size_t count_;
  bool to_device_;
};

Napi::Value NcclUniqueId(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const sapipe_cuda_plugin_v1* cuda = require_nccl_table(env);
  Napi::Uint8Array out = Napi::Uint8Array::New(env, SAPIPE_NCCL_UNIQUE_ID_BYTES);
  const sapipe_status s = cuda->nccl_get_unique_id(out.Data());
  if (s != SAPIPE_OK) throw_error(env, sapipe_status_code(s), std::string("ncclGetUniqueId: ") + cuda->last_error());
  return out;
}

class NcclComm : public Napi::ObjectWrap<NcclComm> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "NcclComm",
                       {InstanceMethod<&NcclComm::Init>("init"), InstanceMethod<&NcclComm::Collective>("collective"),
                        InstanceMethod<&NcclComm::FusedUpdate>("fusedUpdate"), InstanceMethod<&NcclComm::Stage>("stage"),
                        InstanceMethod<&NcclComm::Destroy>("destroy")});
  }

  // new NcclComm(device, size, rank, timeoutMs): checks NCCL first (so a missing NCCL is named even
  // without a GPU), then the device.
  explicit NcclComm(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NcclComm>(info) {
    Napi::Env env = info.Env();
    const double device = integer_arg(env, info[0], 0, 1023, "NcclComm(device)");
    const double size = integer_arg(env, info[1], 1, 65536, "NcclComm(size)");
    const double rank = integer_arg(env, info[2], 0, size - 1, "NcclComm(rank)");
    const double timeout = integer_arg(env, info[3], 1, 2147483647.0, "NcclComm(timeoutMs)");
    require_nccl_table(env);
    st_ = std::make_shared<NcclState>();
    st_->cuda = require_device_table(env, static_cast<int32_t>(device));
    st_->device = static_cast<int32_t>(device);
    st_->size = static_cast<int32_t>(size);
    st_->rank = static_cast<int32_t>(rank);
    st_->timeout_ms = static_cast<int64_t>(timeout);
  }

 private:
  std::shared_ptr<NcclState> st_;

  // init(queue, id: Uint8Array of 128 bytes) -> Promise<void>
  Napi::Value Init(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Queue* queue = Queue::FromValue(env, info[0]);
    if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array ||
        info[1].As<Napi::Uint8Array>().ElementLength() != SAPIPE_NCCL_UNIQUE_ID_BYTES)
      throw_error(env, "ERR_INVALID_ARGUMENT", "NcclComm.init(queue, id): id must be a Uint8Array of 128 bytes");
    return queue->Submit(env, new InitOp(env, st_, info[1].As<Napi::Uint8Array>().Data()));
  }

  std::shared_ptr<DeviceAllocation> on_device(Napi::Env env, const Napi::Value& v, const char* what) {
    std::shared_ptr<DeviceAllocation> m = CudaBuffer::FromValue(env, v, what);
    if (m->device != st_->device)
      throw_error(env, "ERR_INVALID_ARGUMENT", std::string(what) + " is on cuda:" + std::to_string(m->device) +
                                                   ", the communicator on cuda:" + std::to_string(st_->device));
    return m;
  }

  static void check_range(Napi::Env env, const DeviceAllocation& m, size_t offset, size_t count, const char* what) {
    if (offset > m.length || count > m.length - offset)
      throw_error(env, "ERR_SIZE_MISMATCH", std::string(what) + ": offset " + std::to_string(offset) + " + count " +
                                                std::to_string(count) + " exceeds the buffer's " + std::to_string(m.length));
  }

  // collective(queue, kind, a, aOffset, count, b | null, bOffset, arg) -> Promise<number> (the
  // non-finite count of a reduction's result, else 0). count is a's elements for every kind but
  // reduceScatter (b's) and allgather (a's, b holding size x count). Buffers used by queued
  // operations may be passed again: the queue runs them in order (only host copies and dispose
  // must wait).
  Napi::Value Collective(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Queue* queue = Queue::FromValue(env, info[0]);
    CollectiveArgs x;
    x.kind = static_cast<int>(integer_arg(env, info[1], 0, 5, "collective(kind)"));
    auto a = on_device(env, info[2], "collective(a)");
    const size_t a_offset = static_cast<size_t>(integer_arg(env, info[3], 0, 9007199254740991.0, "collective(aOffset)"));
    x.count = static_cast<size_t>(integer_arg(env, info[4], 0, 9007199254740991.0, "collective(count)"));
    x.arg = static_cast<int32_t>(integer_arg(env, info[7], 0, 65535, "collective(arg)"));
    std::vector<std::shared_ptr<DeviceAllocation>> held{a};
    const size_t n = static_cast<size_t>(st_->size);
    if (x.kind == kReduceScatter || x.kind == kAllGather) {
      auto b = on_device(env, info[5], "collective(b)");
      const size_t b_offset = static_cast<size_t>(integer_arg(env, info[6], 0, 9007199254740991.0, "collective(bOffset)"));
      check_range(env, *a, a_offset, x.kind == kReduceScatter ? x.count * n : x.count, "collective(a)");
      check_range(env, *b, b_offset, x.kind == kReduceScatter ? x.count : x.count * n, "collective(b)");
      x.b = b->data + b_offset;
      held.push_back(b);
    } else {
      check_range(env, *a, a_offset, x.count, "collective(a)");
    }
    x.a = a->data + a_offset;
    return queue->Submit(env, new CollectiveOp(env, st_, std::move(held), x));
  }

  // fusedUpdate(queue, config, buffers, bucketCounts, sharded, recheck) -> Promise<{applied, overflowRisk, nonFiniteCount}>
  Napi::Value FusedUpdate(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Queue* queue = Queue::FromValue(env, info[0]);
    const sapipe_update_config config = parse_update_config(expect_object(env, info[1], "config"));
    // Queued behind earlier operations on the same queue, which may use the same buffers.
    DeviceUpdate update = parse_device_update(env, info[2], st_->device, false);
    update.buffers.offset = 0;  // the whole set: the buckets (or parts) split it
    update.buffers.count = update.held.front()->length;
    if (!info[3].IsArray()) throw_error(env, "ERR_INVALID_ARGUMENT", "fusedUpdate(bucketCounts) must be an array");
    Napi::Array counts = info[3].As<Napi::Array>();
    std::vector<size_t> buckets;
    for (uint32_t i = 0; i < counts.Length(); ++i)
      buckets.push_back(static_cast<size_t>(integer_arg(env, counts.Get(i), 1, 9007199254740991.0, "fusedUpdate(bucketCounts[i])")));
    const bool sharded = info[4].ToBoolean().Value();
    const bool recheck = info[5].ToBoolean().Value();
    return queue->Submit(env, new FusedOp(env, st_, std::move(update.held), config, update.buffers, std::move(buckets), sharded, recheck));
  }

  // stage(queue, toDevice, device, host, count) -> Promise<void>: copies the first `count` floats of
  // host (a NativeBuffer) to device, or of device to host, in order with the queue's operations.
  Napi::Value Stage(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Queue* queue = Queue::FromValue(env, info[0]);
    const bool to_device = info[1].ToBoolean().Value();
    auto device = on_device(env, info[2], "stage(device)");
    std::shared_ptr<AlignedBuffer> host = NativeBuffer::FromValue(env, info[3], "stage(host)");
    const size_t count = static_cast<size_t>(integer_arg(env, info[4], 0, 9007199254740991.0, "stage(count)"));
    if (count > device->length || count > host->size())
      throw_error(env, "ERR_SIZE_MISMATCH", "stage: " + std::to_string(count) + " floats exceed the device buffer's " +
                                                std::to_string(device->length) + " or the host buffer's " + std::to_string(host->size()));
    if (host->in_use()) throw_error(env, "ERR_BUSY", "stage(host): a queued operation still uses the host buffer; await it first");
    return queue->Submit(env, new StageOp(env, st_, std::move(device), std::move(host), count, to_device));
  }

  // destroy(): aborts now when idle; otherwise the operation in flight aborts it (its promise then
  // rejects with ERR_DISPOSED). Idempotent.
  Napi::Value Destroy(const Napi::CallbackInfo& info) {
    st_->destroy_requested.store(true);
    if (st_->in_flight.load() == 0) {
      std::lock_guard<std::mutex> lock(st_->mutex);
      st_->release_locked("destroyed");
    }
    return info.Env().Undefined();
  }
};

}  // namespace

void InitNcclComm(Napi::Env env, Napi::Object exports) {
  exports.Set("NcclComm", NcclComm::Define(env));
  exports.Set("ncclUniqueId", Napi::Function::New(env, NcclUniqueId, "ncclUniqueId"));
}

}  // namespace sapipe::addon
