// update(config, buffers) and updateAsync(queue, config, buffers, clip?): one call per optimizer
// step for a whole ParamSet (or one bucket of it, with offset and count).
#include <cmath>
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

class UpdateOp : public AsyncOp {
 public:
  UpdateOp(Napi::Env env, ParsedUpdate parsed, std::optional<Clip> clip) : AsyncOp(env), parsed_(std::move(parsed)), clip_(clip) {
    for (auto& b : parsed_.held) b->acquire();
    if (parsed_.read_only) parsed_.read_only->acquire_read();
  }
  ~UpdateOp() override { release(); }
  void Run() override {
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
  }
  ParsedUpdate parsed_;
  std::optional<Clip> clip_;
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
  return queue->Submit(env, new UpdateOp(env, std::move(parsed), clip));
}

Napi::Value BytesPerElement(const Napi::CallbackInfo& info) {
  sapipe_update_config cfg = parse_update_config(expect_object(info.Env(), info[0], "config"));
  return Napi::Number::New(info.Env(), sapipe_update_bytes_per_element(&cfg));
}

}  // namespace

void InitUpdate(Napi::Env env, Napi::Object exports) {
  exports.Set("update", Napi::Function::New(env, Update, "update"));
  exports.Set("updateAsync", Napi::Function::New(env, UpdateAsync, "updateAsync"));
  exports.Set("updateBytesPerElement", Napi::Function::New(env, BytesPerElement, "updateBytesPerElement"));
}

}  // namespace sapipe::addon
