// NcclComm: one rank's NCCL communicator, seen from JS. Operations run on an ExecutionQueue's
// worker thread: what each does there (its NCCL calls through the CUDA plugin's table, then the
// watchdog's wait, which aborts the communicator instead of hanging when a peer dies) is
// native/comm/nccl/nccl_ops.h. This file converts arguments and owns lifetimes.
#include "comm_nccl_binding.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../../comm/nccl/nccl_ops.h"
#include "../errors.h"
#include "../js_args.h"
#include "../native_buffer.h"
#include "../queue.h"
#include "../update_binding.h"
#include "cuda_binding.h"
#include "cuda_buffer.h"
#include "cuda_events.h"
#include "../../core/device/cuda_plugin.h"
#include "sapipe/plugin.h"

namespace sapipe::addon {
namespace {

using comm::nccl::Clock;
using comm::nccl::NcclState;
using comm::nccl::Outcome;

// Every operation: holds the state and the device memory it uses (busy while queued); what it
// does on the queue's thread is native/comm/nccl/nccl_ops.h.
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
    outcome_ = RunOn(comm::nccl::operation_deadline(*st_));
    comm::nccl::finish_operation(*st_);
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
  virtual Outcome RunOn(Clock::time_point deadline) = 0;
  virtual Napi::Value Value(Napi::Env env) { return env.Undefined(); }
  std::shared_ptr<NcclState> st_;

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
  Outcome RunOn(Clock::time_point) override { return comm::nccl::init_communicator(*st_, id_); }

 private:
  uint8_t id_[SAPIPE_NCCL_UNIQUE_ID_BYTES];
};

class CollectiveOp : public NcclOp {
 public:
  CollectiveOp(Napi::Env env, std::shared_ptr<NcclState> st, std::vector<std::shared_ptr<DeviceAllocation>> held,
               comm::nccl::NcclCollective args)
      : NcclOp(env, std::move(st), std::move(held)), args_(args) {}

 protected:
  Outcome RunOn(Clock::time_point deadline) override { return comm::nccl::run_collective(*st_, args_, deadline, &non_finite_); }
  Napi::Value Value(Napi::Env env) override { return Napi::Number::New(env, static_cast<double>(non_finite_)); }

 private:
  comm::nccl::NcclCollective args_;
  int64_t non_finite_ = 0;
};

class FusedOp : public NcclOp {
 public:
  FusedOp(Napi::Env env, std::shared_ptr<NcclState> st, std::vector<std::shared_ptr<DeviceAllocation>> held, comm::nccl::FusedStep step,
          std::shared_ptr<EventSet> ready)
      : NcclOp(env, std::move(st), std::move(held)), step_(std::move(step)), ready_(std::move(ready)) {}

 protected:
  Outcome RunOn(Clock::time_point deadline) override { return comm::nccl::run_fused_step(*st_, step_, deadline, &result_); }
  Napi::Value Value(Napi::Env env) override {
    Napi::Object o = Napi::Object::New(env);
    o.Set("applied", Napi::Boolean::New(env, result_.applied != 0));
    o.Set("overflowRisk", Napi::Boolean::New(env, result_.overflow_risk != 0));
    o.Set("nonFiniteCount", Napi::Number::New(env, static_cast<double>(result_.non_finite_count)));
    return o;
  }

 private:
  comm::nccl::FusedStep step_;
  // The events step_.ready points into, alive until the step is done.
  std::shared_ptr<EventSet> ready_;
  sapipe_nccl_step_result result_{};
};

// A copy between host memory and device memory queued with the communicator's other operations
// (comm::nccl::stage_copy). The host buffer is held busy until the copy is done (read: copied in;
// written: copied out).
class StageOp : public NcclOp {
 public:
  StageOp(Napi::Env env, std::shared_ptr<NcclState> st, std::shared_ptr<DeviceAllocation> device, std::shared_ptr<AlignedBuffer> host,
          size_t count, bool to_device)
      : NcclOp(env, std::move(st), {device}), device_(std::move(device)), host_(std::move(host)), count_(count), to_device_(to_device) {
    host_->acquire();
  }
  ~StageOp() override { host_->release(); }

 protected:
  Outcome RunOn(Clock::time_point deadline) override {
    return comm::nccl::stage_copy(*st_, device_->data, host_->data(), count_, to_device_, deadline);
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
    comm::nccl::NcclCollective x;
    x.kind = static_cast<int32_t>(integer_arg(env, info[1], 0, 5, "collective(kind)"));
    auto a = on_device(env, info[2], "collective(a)");
    const size_t a_offset = static_cast<size_t>(integer_arg(env, info[3], 0, 9007199254740991.0, "collective(aOffset)"));
    x.count = static_cast<size_t>(integer_arg(env, info[4], 0, 9007199254740991.0, "collective(count)"));
    x.arg = static_cast<int32_t>(integer_arg(env, info[7], 0, 65535, "collective(arg)"));
    std::vector<std::shared_ptr<DeviceAllocation>> held{a};
    const size_t n = static_cast<size_t>(st_->size);
    using comm::nccl::kNcclAllGather;
    using comm::nccl::kNcclReduceScatter;
    if (x.kind == kNcclReduceScatter || x.kind == kNcclAllGather) {
      auto b = on_device(env, info[5], "collective(b)");
      const size_t b_offset = static_cast<size_t>(integer_arg(env, info[6], 0, 9007199254740991.0, "collective(bOffset)"));
      check_range(env, *a, a_offset, x.kind == kNcclReduceScatter ? x.count * n : x.count, "collective(a)");
      check_range(env, *b, b_offset, x.kind == kNcclReduceScatter ? x.count : x.count * n, "collective(b)");
      x.b = b->data + b_offset;
      held.push_back(b);
    } else {
      check_range(env, *a, a_offset, x.count, "collective(a)");
    }
    x.a = a->data + a_offset;
    return queue->Submit(env, new CollectiveOp(env, st_, std::move(held), x));
  }

  // fusedUpdate(queue, config, buffers, bucketCounts, sharded, recheck, ready?) -> Promise<{applied, overflowRisk,
  // nonFiniteCount}>. ready: a CudaEvents of one event per bucket, each recorded once the backward
  // pass enqueued that bucket's gradient; the bucket's reduction waits for it on the GPU.
  Napi::Value FusedUpdate(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Queue* queue = Queue::FromValue(env, info[0]);
    comm::nccl::FusedStep step;
    step.config = parse_update_config(expect_object(env, info[1], "config"));
    // Queued behind earlier operations on the same queue, which may use the same buffers.
    DeviceUpdate update = parse_device_update(env, info[2], st_->device, false);
    update.buffers.offset = 0;  // the whole set: the buckets (or parts) split it
    update.buffers.count = update.held.front()->length;
    step.buffers = update.buffers;
    if (!info[3].IsArray()) throw_error(env, "ERR_INVALID_ARGUMENT", "fusedUpdate(bucketCounts) must be an array");
    Napi::Array counts = info[3].As<Napi::Array>();
    for (uint32_t i = 0; i < counts.Length(); ++i)
      step.buckets.push_back(static_cast<size_t>(integer_arg(env, counts.Get(i), 1, 9007199254740991.0, "fusedUpdate(bucketCounts[i])")));
    step.sharded = info[4].ToBoolean().Value();
    step.recheck = info[5].ToBoolean().Value();
    std::shared_ptr<EventSet> ready;
    if (!info[6].IsUndefined() && !info[6].IsNull()) {
      ready = CudaEvents::FromValue(env, info[6], "fusedUpdate(ready)");
      if (step.sharded || step.recheck)
        throw_error(env, "ERR_INVALID_ARGUMENT", "fusedUpdate(ready): events are for the replicated step, not sharded or a recheck");
      if (ready->device != st_->device)
        throw_error(env, "ERR_INVALID_ARGUMENT", "fusedUpdate(ready): the events are on cuda:" + std::to_string(ready->device) +
                                                     ", the communicator on cuda:" + std::to_string(st_->device));
      if (ready->events.size() != step.buckets.size())
        throw_error(env, "ERR_SIZE_MISMATCH", "fusedUpdate(ready): " + std::to_string(ready->events.size()) + " events for " +
                                                  std::to_string(step.buckets.size()) + " buckets; give one per bucket");
      if (!has_fused_update_after(st_->cuda))
        throw_error(env, "ERR_BACKEND_UNAVAILABLE",
                    "the CUDA plugin predates the step that waits for a backward pass's events (nccl_fused_update_after): rebuild it with "
                    "`npm run build:native`, or let the trainer wait for the whole backward (overlapBackward: false)");
      step.ready = ready->events;
    }
    return queue->Submit(env, new FusedOp(env, st_, std::move(update.held), std::move(step), std::move(ready)));
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
    comm::nccl::request_destroy(*st_);
    return info.Env().Undefined();
  }
};

}  // namespace

void InitNcclComm(Napi::Env env, Napi::Object exports) {
  exports.Set("NcclComm", NcclComm::Define(env));
  exports.Set("ncclUniqueId", Napi::Function::New(env, NcclUniqueId, "ncclUniqueId"));
}

}  // namespace sapipe::addon
