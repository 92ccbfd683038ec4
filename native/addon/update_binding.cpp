// update(config, buffers) and updateAsync(queue, config, buffers, clip?, gate?): one call per
// optimizer step for a whole ParamSet (or one bucket of it, with offset and count); and
// guardAsync(queue, grad, gate, size), the verdict a gated bucket update reads; and
// latchSignalAsync(queue, latch, slot). What the queued operations do when they run is
// native/core (queued_update.h, latch.h); this file converts arguments and holds the buffers.
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "../core/latch.h"
#include "../core/queued_update.h"
#include "errors.h"
#include "js_args.h"
#include "native_buffer.h"
#include "queue.h"
#include "sapipe/kernels.h"
#include "update_binding.h"

namespace sapipe::addon {

sapipe_update_config parse_update_config(const Napi::Object& c) {
  sapipe_update_config cfg{};
  cfg.optimizer = static_cast<int32_t>(get_number(c, "optimizer", -1));
  cfg.lr = static_cast<float>(get_number(c, "lr", -1));
  cfg.weight_decay = static_cast<float>(get_number(c, "weightDecay", 0));
  cfg.momentum = static_cast<float>(get_number(c, "momentum", 0));
  cfg.dampening = static_cast<float>(get_number(c, "dampening", 0));
  cfg.nesterov = get_bool(c, "nesterov", false);
  cfg.momentum_is_empty = get_bool(c, "momentumIsEmpty", false);
  cfg.spike_delay = static_cast<int32_t>(get_number(c, "spikeDelay", -1));
  cfg.beta1 = static_cast<float>(get_number(c, "beta1", 0.9));
  cfg.beta2 = static_cast<float>(get_number(c, "beta2", 0.999));
  cfg.eps = static_cast<float>(get_number(c, "eps", 1e-8));
  cfg.step = static_cast<int64_t>(get_number(c, "step", 1));
  cfg.grad_scale = static_cast<float>(get_number(c, "gradScale", 1));
  cfg.grad_checked = get_bool(c, "gradChecked", false);
  cfg.compensation = static_cast<int32_t>(get_number(c, "compensation", 0));
  cfg.compensation_lambda = static_cast<float>(get_number(c, "compensationLambda", 0.2));
  cfg.compensation_eps = static_cast<float>(get_number(c, "compensationEps", 1e-7));
  cfg.prediction = static_cast<int32_t>(get_number(c, "prediction", 0));
  cfg.estimate = static_cast<int32_t>(get_number(c, "estimate", 0));
  cfg.compensate_estimate = get_bool(c, "compensateEstimate", false);
  cfg.world_size = static_cast<float>(get_number(c, "worldSize", 1));
  cfg.have_prev_local = get_bool(c, "havePrevLocal", false);
  cfg.local_grad_scale = static_cast<float>(get_number(c, "localGradScale", 1));
  cfg.prediction_steps = static_cast<float>(get_number(c, "predictionSteps", 0));
  return cfg;
}

ParsedUpdate parse_update(Napi::Env env, const Napi::Value& config, const Napi::Value& buffers) {
  ParsedUpdate out;
  out.config = parse_update_config(expect_object(env, config, "config"));
  Napi::Object b = expect_object(env, buffers, "buffers");
  auto weights = NativeBuffer::FromValue(env, b.Get("weights"), "buffers.weights");
  const size_t length = weights->size();
  out.held.push_back(weights);
  auto optional = [&](const char* key) -> float* {
    Napi::Value v = b.Get(key);
    if (v.IsUndefined() || v.IsNull()) return nullptr;
    auto buf = NativeBuffer::FromValue(env, v, (std::string("buffers.") + key).c_str());
    if (buf->size() != length)
      throw_error(env, "ERR_SIZE_MISMATCH",
                  std::string("buffers.") + key + " has " + std::to_string(buf->size()) +
                      " elements but buffers.weights has " + std::to_string(length));
    if (std::string(key) == "weightsIn") out.read_only = buf;
    else out.held.push_back(buf);
    return buf->data();
  };
  out.buffers = read_update_buffers(env, b, weights->data(), length, optional);
  return out;
}

namespace {

Napi::Value result_object(Napi::Env env, const sapipe_update_result& r) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("applied", Napi::Boolean::New(env, r.applied != 0));
  o.Set("nonFiniteCount", Napi::Number::New(env, static_cast<double>(r.non_finite_count)));
  return o;
}

core::GradClip parse_clip(Napi::Env env, const Napi::Value& v) {
  Napi::Object o = expect_object(env, v, "clip");
  core::GradClip c;
  c.max_norm = get_number(o, "maxNorm", -1);
  c.base = get_number(o, "base", 1);
  c.unscale = get_number(o, "unscale", 1);
  if (!(c.max_norm > 0) || !std::isfinite(c.max_norm) || !std::isfinite(c.base) || !std::isfinite(c.unscale))
    throw_error(env, "ERR_INVALID_ARGUMENT", "updateAsync: clip needs a positive finite maxNorm and finite base and unscale");
  return c;
}

// A queued update (core::run_queued_update: the latch, the gate, clipping, the kernel), holding
// its buffers from submission until its Promise settles.
class UpdateOp : public AsyncOp {
 public:
  UpdateOp(Napi::Env env, ParsedUpdate parsed, std::optional<core::GradClip> clip, std::shared_ptr<AlignedBuffer> gate,
           std::shared_ptr<AlignedBuffer> latch, size_t latch_slot, core::LatchClock::time_point deadline)
      : AsyncOp(env), parsed_(std::move(parsed)), gate_(std::move(gate)), latch_(std::move(latch)) {
    for (auto& b : parsed_.held) b->acquire();
    if (parsed_.read_only) parsed_.read_only->acquire_read();
    if (gate_) gate_->acquire();
    if (latch_) latch_->acquire();
    update_.config = parsed_.config;
    update_.buffers = parsed_.buffers;
    update_.clip = clip;
    update_.gate = gate_ ? gate_->data() : nullptr;
    update_.latch = latch_ ? latch_->data() : nullptr;
    update_.latch_slot = latch_slot;
    update_.deadline = deadline;
  }
  ~UpdateOp() override { release(); }
  bool Failed() const override { return status_ != SAPIPE_OK; }
  void Run() override { status_ = core::run_queued_update(update_, &result_, &grad_norm_); }
  Napi::Value Result(Napi::Env env) override {
    release();  // the continuation may dispose the buffers
    if (status_ != SAPIPE_OK) throw make_status_error(env, status_, "update");
    Napi::Value r = result_object(env, result_);
    if (update_.clip) r.As<Napi::Object>().Set("gradNorm", Napi::Number::New(env, grad_norm_));
    return r;
  }

 private:
  void release() {
    for (auto& b : parsed_.held) b->release();
    parsed_.held.clear();
    if (parsed_.read_only) parsed_.read_only->release_read();
    parsed_.read_only.reset();
    if (gate_) gate_->release();
    gate_.reset();
    if (latch_) latch_->release();
    latch_.reset();
  }
  ParsedUpdate parsed_;
  std::shared_ptr<AlignedBuffer> gate_, latch_;
  core::QueuedUpdate update_;
  double grad_norm_ = 0;
  sapipe_status status_ = SAPIPE_ERR_INTERNAL;
  sapipe_update_result result_{};
};

Napi::Value Update(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  ParsedUpdate parsed = parse_update(env, info[0], info[1]);
  // The step writes `held` (nothing else may be using them) and only reads `read_only`.
  for (auto& b : parsed.held)
    if (b->in_use()) throw_error(env, "ERR_BUSY", "update: a buffer is in use by a pending asynchronous step; await it first");
  if (parsed.read_only && parsed.read_only->busy())
    throw_error(env, "ERR_BUSY", "update: buffers.weightsIn is being written by a pending asynchronous step; await it first");
  sapipe_update_result result{};
  sapipe_status status = sapipe_cpu_update(&parsed.config, &parsed.buffers, &result);
  if (status != SAPIPE_OK) throw_status(env, status, "update");
  return result_object(env, result);
}

Napi::Value UpdateAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Queue* queue = Queue::FromValue(env, info[0]);
  ParsedUpdate parsed = parse_update(env, info[1], info[2]);
  std::optional<core::GradClip> clip;
  if (info.Length() > 3 && !info[3].IsUndefined() && !info[3].IsNull()) clip = parse_clip(env, info[3]);
  std::shared_ptr<AlignedBuffer> gate;
  if (info.Length() > 4 && !info[4].IsUndefined() && !info[4].IsNull()) {
    if (clip) throw_error(env, "ERR_INVALID_ARGUMENT", "updateAsync: a gated bucket update cannot clip (the norm needs every bucket)");
    gate = NativeBuffer::FromValue(env, info[4], "updateAsync(gate)");
    if (gate->size() < 2) throw_error(env, "ERR_SIZE_MISMATCH", "updateAsync: the gate holds at least 2 floats");
    for (auto& b : parsed.held)
      if (b == gate) throw_error(env, "ERR_ALIASING", "updateAsync: the gate must not be a buffer the update writes");
  }
  // wait: { latch, slot, timeoutMs }: run only once latchSignalAsync(latch, slot) has run.
  std::shared_ptr<AlignedBuffer> latch;
  size_t slot = 0;
  core::LatchClock::time_point deadline{};
  if (info.Length() > 5 && !info[5].IsUndefined() && !info[5].IsNull()) {
    Napi::Object o = expect_object(env, info[5], "updateAsync(wait)");
    latch = NativeBuffer::FromValue(env, o.Get("latch"), "updateAsync(wait.latch)");
    slot = static_cast<size_t>(integer_arg(env, o.Get("slot"), 0, 9007199254740991.0, "updateAsync(wait.slot)"));
    deadline = core::LatchClock::now() +
               std::chrono::milliseconds(static_cast<int64_t>(integer_arg(env, o.Get("timeoutMs"), 1, 2147483647.0, "updateAsync(wait.timeoutMs)")));
    if (slot >= latch->size()) throw_error(env, "ERR_SIZE_MISMATCH", "updateAsync: wait.slot is past the latch buffer");
    for (auto& b : parsed.held)
      if (b == latch) throw_error(env, "ERR_ALIASING", "updateAsync: the latch must not be a buffer the update writes");
  }
  return queue->Submit(env, new UpdateOp(env, std::move(parsed), clip, std::move(gate), std::move(latch), slot, deadline));
}

// latchSignalAsync(queue, latch, slot): queued behind the operation it vouches for
// (core::signal_latch); dropped unrun, it fails its waiters (core::drop_latch_signal).
class SignalOp : public AsyncOp {
 public:
  SignalOp(Napi::Env env, std::shared_ptr<AlignedBuffer> latch, size_t slot) : AsyncOp(env), latch_(std::move(latch)), slot_(slot) {
    latch_->acquire();
  }
  // Dropped unrun (its queue shut down, as when a worker is terminated): the waiting update fails
  // at once instead of sitting out its deadline.
  ~SignalOp() override {
    if (latch_ && !ran_) core::drop_latch_signal(latch_->data(), slot_);
    release();
  }
  void Run() override {
    core::signal_latch(latch_->data(), slot_, previous_failed());
    ran_ = true;
  }
  Napi::Value Result(Napi::Env env) override {
    release();
    return env.Undefined();
  }

 private:
  void release() {
    if (latch_) latch_->release();
    latch_.reset();
  }
  std::shared_ptr<AlignedBuffer> latch_;
  size_t slot_;
  bool ran_ = false;
};

Napi::Value LatchSignalAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Queue* queue = Queue::FromValue(env, info[0]);
  auto latch = NativeBuffer::FromValue(env, info[1], "latchSignalAsync(latch)");
  const size_t slot = static_cast<size_t>(integer_arg(env, info[2], 0, 9007199254740991.0, "latchSignalAsync(slot)"));
  if (slot >= latch->size()) throw_error(env, "ERR_SIZE_MISMATCH", "latchSignalAsync: the slot is past the latch buffer");
  return queue->Submit(env, new SignalOp(env, std::move(latch), slot));
}

// guardAsync(queue, grad, gate, size): this rank's half of a bucketed step's guard
// (core::guard_verdict), queued before its reductions.
class GuardOp : public AsyncOp {
 public:
  GuardOp(Napi::Env env, std::shared_ptr<AlignedBuffer> grad, std::shared_ptr<AlignedBuffer> gate, double size)
      : AsyncOp(env), grad_(std::move(grad)), gate_(std::move(gate)), size_(size) {
    grad_->acquire();
    gate_->acquire();
  }
  ~GuardOp() override { release(); }
  bool Failed() const override { return status_ != SAPIPE_OK; }
  void Run() override { status_ = core::guard_verdict(grad_->data(), grad_->size(), size_, gate_->data()); }
  Napi::Value Result(Napi::Env env) override {
    release();
    if (status_ != SAPIPE_OK) throw make_status_error(env, status_, "guard");
    return env.Undefined();
  }

 private:
  void release() {
    if (grad_) grad_->release();
    if (gate_) gate_->release();
    grad_.reset();
    gate_.reset();
  }
  std::shared_ptr<AlignedBuffer> grad_, gate_;
  double size_;
  sapipe_status status_ = SAPIPE_ERR_INTERNAL;
};

Napi::Value GuardAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Queue* queue = Queue::FromValue(env, info[0]);
  auto grad = NativeBuffer::FromValue(env, info[1], "guardAsync(grad)");
  auto gate = NativeBuffer::FromValue(env, info[2], "guardAsync(gate)");
  const double size = integer_arg(env, info[3], 1, 65536, "guardAsync(size)");
  if (gate->size() < 2) throw_error(env, "ERR_SIZE_MISMATCH", "guardAsync: the gate holds at least 2 floats");
  if (gate == grad) throw_error(env, "ERR_ALIASING", "guardAsync: the gate and the gradient must be different buffers");
  return queue->Submit(env, new GuardOp(env, std::move(grad), std::move(gate), size));
}

Napi::Value BytesPerElement(const Napi::CallbackInfo& info) {
  sapipe_update_config cfg = parse_update_config(expect_object(info.Env(), info[0], "config"));
  return Napi::Number::New(info.Env(), sapipe_update_bytes_per_element(&cfg));
}

}  // namespace

void InitUpdate(Napi::Env env, Napi::Object exports) {
  exports.Set("update", Napi::Function::New(env, Update, "update"));
  exports.Set("updateAsync", Napi::Function::New(env, UpdateAsync, "updateAsync"));
  exports.Set("guardAsync", Napi::Function::New(env, GuardAsync, "guardAsync"));
  exports.Set("latchSignalAsync", Napi::Function::New(env, LatchSignalAsync, "latchSignalAsync"));
  exports.Set("updateBytesPerElement", Napi::Function::New(env, BytesPerElement, "updateBytesPerElement"));
}

}  // namespace sapipe::addon
