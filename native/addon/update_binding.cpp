// update(config, buffers) and updateAsync(queue, config, buffers, clip?, gate?): one call per
// optimizer step for a whole ParamSet (or one bucket of it, with offset and count); and
// guardAsync(queue, grad, gate, size), the verdict a gated bucket update reads.
#include <cfloat>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <memory>
#include <optional>
#include <vector>

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

// Gradient-norm clipping decided where the update runs, once the gradient it reads is complete
// (behind its all-reduce on a queue): the norm in the units the optimizer applies is
// sqrt(sum g^2) * base * unscale, and above max_norm the step's scale becomes
// base * unscale * max_norm / (norm + 1e-6). Computed in double in the same order as the trainer's
// JavaScript path, so both give the same float scale.
struct Clip {
  double max_norm = 0;
  double base = 1;     // the optimizer's gradScale
  double unscale = 1;  // loss scale and accumulation removed
};

Clip parse_clip(Napi::Env env, const Napi::Value& v) {
  Napi::Object o = expect_object(env, v, "clip");
  Clip c;
  c.max_norm = get_number(o, "maxNorm", -1);
  c.base = get_number(o, "base", 1);
  c.unscale = get_number(o, "unscale", 1);
  if (!(c.max_norm > 0) || !std::isfinite(c.max_norm) || !std::isfinite(c.base) || !std::isfinite(c.unscale))
    throw_error(env, "ERR_INVALID_ARGUMENT", "updateAsync: clip needs a positive finite maxNorm and finite base and unscale");
  return c;
}

// Latches between two queues: a bucket's update waits on the optimizer's queue until the signal
// queued behind that bucket's reduction on the communicator's queue has run. A latch is a slot of a
// NativeBuffer (0 until signalled, 1 signalled, -1 when the signal was dropped unrun, its queue
// shut down, or ran behind a failed operation); one mutex for every latch, which also orders the signalling thread's earlier writes
// (the reduced bucket, the verdict) before the waiting update's reads.
std::mutex latch_mutex;
std::condition_variable latch_signalled;

struct LatchWait {
  std::shared_ptr<AlignedBuffer> latch;
  size_t slot = 0;
  // Absolute, from submission: every collective queued before the signal has its own deadline
  // from its submission, so the signal comes within about one timeout unless it is dropped.
  std::chrono::steady_clock::time_point deadline;
};

// Waits for the slot: SAPIPE_OK once signalled, SAPIPE_ERR_DISPOSED when the signal was dropped
// unrun or ran behind a failure, SAPIPE_ERR_TIMEOUT when the deadline passed first.
sapipe_status wait_for_latch(const LatchWait& w) {
  std::unique_lock<std::mutex> lock(latch_mutex);
  if (!latch_signalled.wait_until(lock, w.deadline, [&] { return w.latch->data()[w.slot] != 0.0f; })) return SAPIPE_ERR_TIMEOUT;
  return w.latch->data()[w.slot] > 0.0f ? SAPIPE_OK : SAPIPE_ERR_DISPOSED;
}

// A gated update (one bucket of a step whose buckets update as their reductions land) runs only
// when the step's all-reduced guard verdict, gate[0] (non-finite inputs over every rank) and
// gate[1] (ranks whose inputs could overflow a sum), is all zeros; otherwise it writes nothing and
// reports gate[0] as its non-finite count. The verdict is complete when the update runs: its
// all-reduce was queued before the bucket's reduction on the same queue.
class UpdateOp : public AsyncOp {
 public:
  UpdateOp(Napi::Env env, ParsedUpdate parsed, std::optional<Clip> clip, std::shared_ptr<AlignedBuffer> gate, std::optional<LatchWait> wait)
      : AsyncOp(env), parsed_(std::move(parsed)), clip_(clip), gate_(std::move(gate)), wait_(std::move(wait)) {
    for (auto& b : parsed_.held) b->acquire();
    if (parsed_.read_only) parsed_.read_only->acquire_read();
    if (gate_) gate_->acquire();
    if (wait_) wait_->latch->acquire();
  }
  ~UpdateOp() override { release(); }
  bool Failed() const override { return status_ != SAPIPE_OK; }
  void Run() override {
    if (wait_) {
      status_ = wait_for_latch(*wait_);
      if (status_ != SAPIPE_OK) return;
    }
    if (gate_ && (gate_->data()[0] != 0.0f || gate_->data()[1] != 0.0f)) {
      result_ = {0, static_cast<int64_t>(gate_->data()[0])};
      status_ = SAPIPE_OK;
      return;
    }
    if (clip_) {
      double sq = 0;
      status_ = sapipe_cpu_squared_norm(parsed_.buffers.grad + parsed_.buffers.offset, parsed_.buffers.count, &sq);
      if (status_ != SAPIPE_OK) return;
      grad_norm_ = std::sqrt(sq) * clip_->base * clip_->unscale;
      double factor = clip_->unscale;
      // A non-finite norm means a non-finite gradient: the guard skips the step, nothing to clip.
      if (std::isfinite(grad_norm_) && grad_norm_ > clip_->max_norm) factor *= clip_->max_norm / (grad_norm_ + 1e-6);
      parsed_.config.grad_scale = static_cast<float>(clip_->base * factor);
    }
    status_ = sapipe_cpu_update(&parsed_.config, &parsed_.buffers, &result_);
  }
  Napi::Value Result(Napi::Env env) override {
    release();  // the continuation may dispose the buffers
    if (status_ != SAPIPE_OK) throw make_status_error(env, status_, "update");
    Napi::Value r = result_object(env, result_);
    if (clip_) r.As<Napi::Object>().Set("gradNorm", Napi::Number::New(env, grad_norm_));
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
    if (wait_) wait_->latch->release();
    wait_.reset();
  }
  ParsedUpdate parsed_;
  std::optional<Clip> clip_;
  std::shared_ptr<AlignedBuffer> gate_;
  std::optional<LatchWait> wait_;
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
  std::optional<Clip> clip;
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
  std::optional<LatchWait> wait;
  if (info.Length() > 5 && !info[5].IsUndefined() && !info[5].IsNull()) {
    Napi::Object o = expect_object(env, info[5], "updateAsync(wait)");
    LatchWait w;
    w.latch = NativeBuffer::FromValue(env, o.Get("latch"), "updateAsync(wait.latch)");
    w.slot = static_cast<size_t>(integer_arg(env, o.Get("slot"), 0, 9007199254740991.0, "updateAsync(wait.slot)"));
    w.deadline = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(static_cast<int64_t>(integer_arg(env, o.Get("timeoutMs"), 1, 2147483647.0, "updateAsync(wait.timeoutMs)")));
    if (w.slot >= w.latch->size()) throw_error(env, "ERR_SIZE_MISMATCH", "updateAsync: wait.slot is past the latch buffer");
    for (auto& b : parsed.held)
      if (b == w.latch) throw_error(env, "ERR_ALIASING", "updateAsync: the latch must not be a buffer the update writes");
    wait = std::move(w);
  }
  return queue->Submit(env, new UpdateOp(env, std::move(parsed), clip, std::move(gate), std::move(wait)));
}

// latchSignalAsync(queue, latch, slot): queued behind the operation it vouches for; sets latch[slot]
// to 1 and wakes the updates waiting on it. Sets -1 instead (the waiting updates fail, writing
// nothing) when the operation run just before it on its queue failed, or when slot - 1 was set to
// -1: a chain of signals on one queue is released only while everything before each succeeded.
class SignalOp : public AsyncOp {
 public:
  SignalOp(Napi::Env env, std::shared_ptr<AlignedBuffer> latch, size_t slot) : AsyncOp(env), latch_(std::move(latch)), slot_(slot) {
    latch_->acquire();
  }
  // Dropped unrun (its queue shut down, as when a worker is terminated): the waiting update fails
  // at once instead of sitting out its deadline.
  ~SignalOp() override {
    if (latch_ && !ran_) set(-1.0f);
    release();
  }
  void Run() override {
    bool earlier_failed;
    {
      std::lock_guard<std::mutex> lock(latch_mutex);
      earlier_failed = slot_ > 0 && latch_->data()[slot_ - 1] < 0.0f;
    }
    set(previous_failed() || earlier_failed ? -1.0f : 1.0f);
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
  void set(float value) {
    {
      std::lock_guard<std::mutex> lock(latch_mutex);
      latch_->data()[slot_] = value;
    }
    latch_signalled.notify_all();
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

// This rank's half of a bucketed step's guard, queued before its reductions: gate[0] = the
// gradient's non-finite elements, gate[1] = 1 when they are none but the elements are large
// enough that a sum of `size` of them could overflow fp32 (sqrt(sum g^2), which bounds every
// |g|, times size reaches FLT_MAX / 2), else 0. The caller then all-reduces the gate (a sum), so
// every rank reads the same verdict. One read of the gradient.
class GuardOp : public AsyncOp {
 public:
  GuardOp(Napi::Env env, std::shared_ptr<AlignedBuffer> grad, std::shared_ptr<AlignedBuffer> gate, double size)
      : AsyncOp(env), grad_(std::move(grad)), gate_(std::move(gate)), size_(size) {
    grad_->acquire();
    gate_->acquire();
  }
  ~GuardOp() override { release(); }
  bool Failed() const override { return status_ != SAPIPE_OK; }
  void Run() override {
    // Skip unless this completes: every rank then reads a verdict that says so.
    gate_->data()[0] = 0.0f;
    gate_->data()[1] = 1.0f;
    double sq = 0;
    status_ = sapipe_cpu_squared_norm(grad_->data(), grad_->size(), &sq);
    if (status_ != SAPIPE_OK) return;
    const double norm = std::sqrt(sq);
    int64_t bad = 0;
    // A non-finite norm means a NaN/Inf element, or finite elements whose squares overflowed:
    // only the count tells which, and the latter is an overflow risk, not a skip.
    if (!std::isfinite(norm)) status_ = sapipe_cpu_count_non_finite(grad_->data(), grad_->size(), &bad);
    if (status_ != SAPIPE_OK) return;
    gate_->data()[0] = static_cast<float>(bad);
    gate_->data()[1] = bad == 0 && !(norm * size_ < static_cast<double>(FLT_MAX) / 2) ? 1.0f : 0.0f;
  }
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
