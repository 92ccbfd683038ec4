// Elementwise kernels on whole NativeBuffers: elastic averaging, reductions, and the bandwidth
// references that benchmarks measure against. All are synchronous: they are building blocks
// that the runtimes call between steps, and each costs one native call.
#include <vector>

#include "errors.h"
#include "js_args.h"
#include "kernels_binding.h"
#include "native_buffer.h"
#include "sapipe/kernels.h"

namespace sapipe::addon {
namespace {

using BufferPtr = std::shared_ptr<AlignedBuffer>;

BufferPtr arg_buffer(const Napi::CallbackInfo& info, size_t index, const char* what) {
  BufferPtr b = NativeBuffer::FromValue(info.Env(), info[index], what);
  if (b->busy()) throw_error(info.Env(), "ERR_BUSY", std::string(what) + " is in use by a pending asynchronous operation");
  return b;
}

float arg_float(const Napi::CallbackInfo& info, size_t index, const char* what) {
  if (!info[index].IsNumber()) throw_error(info.Env(), "ERR_INVALID_ARGUMENT", std::string(what) + " must be a number");
  return info[index].As<Napi::Number>().FloatValue();
}

void same_length(Napi::Env env, const char* op, const BufferPtr& a, const BufferPtr& b) {
  if (a->size() != b->size())
    throw_error(env, "ERR_SIZE_MISMATCH", std::string(op) + ": buffers have " + std::to_string(a->size()) +
                                              " and " + std::to_string(b->size()) + " elements");
}

void check(Napi::Env env, sapipe_status status, const char* op) {
  if (status != SAPIPE_OK) throw_status(env, status, op);
}

Napi::Value ElasticAverage(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  BufferPtr worker = arg_buffer(info, 0, "worker"), center = arg_buffer(info, 1, "center");
  same_length(env, "elasticAverage", worker, center);
  if (worker == center) throw_error(env, "ERR_ALIASING", "elasticAverage: worker and center must be different buffers");
  check(env, sapipe_cpu_elastic_average(worker->data(), center->data(), worker->size(), arg_float(info, 2, "alpha")),
        "elasticAverage");
  return env.Undefined();
}

Napi::Value Sum(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  BufferPtr out = arg_buffer(info, 0, "out");
  if (!info[1].IsArray()) throw_error(env, "ERR_INVALID_ARGUMENT", "sum: inputs must be an array of NativeBuffer");
  Napi::Array list = info[1].As<Napi::Array>();
  if (list.Length() == 0) throw_error(env, "ERR_INVALID_ARGUMENT", "sum: inputs must not be empty");
  std::vector<BufferPtr> inputs;
  std::vector<const float*> ptrs;
  for (uint32_t i = 0; i < list.Length(); ++i) {
    BufferPtr b = NativeBuffer::FromValue(env, list.Get(i), "sum input");
    same_length(env, "sum", out, b);
    inputs.push_back(b);
    ptrs.push_back(b->data());
  }
  int64_t non_finite = 0;
  check(env, sapipe_cpu_sum(out->data(), ptrs.data(), ptrs.size(), out->size(), arg_float(info, 2, "scale"), &non_finite),
        "sum");
  return Napi::Number::New(env, static_cast<double>(non_finite));
}

Napi::Value Scale(const Napi::CallbackInfo& info) {
  BufferPtr x = arg_buffer(info, 0, "x");
  check(info.Env(), sapipe_cpu_scale(x->data(), x->size(), arg_float(info, 1, "scale")), "scale");
  return info.Env().Undefined();
}

Napi::Value Axpy(const Napi::CallbackInfo& info) {
  BufferPtr y = arg_buffer(info, 0, "y"), x = arg_buffer(info, 1, "x");
  same_length(info.Env(), "axpy", y, x);
  check(info.Env(), sapipe_cpu_axpy(y->data(), x->data(), y->size(), arg_float(info, 2, "a")), "axpy");
  return info.Env().Undefined();
}

Napi::Value SquaredNorm(const Napi::CallbackInfo& info) {
  BufferPtr x = arg_buffer(info, 0, "x");
  double out = 0;
  check(info.Env(), sapipe_cpu_squared_norm(x->data(), x->size(), &out), "squaredNorm");
  return Napi::Number::New(info.Env(), out);
}

Napi::Value CountNonFinite(const Napi::CallbackInfo& info) {
  BufferPtr x = arg_buffer(info, 0, "x");
  int64_t out = 0;
  check(info.Env(), sapipe_cpu_count_non_finite(x->data(), x->size(), &out), "countNonFinite");
  return Napi::Number::New(info.Env(), static_cast<double>(out));
}

Napi::Value Triad(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  BufferPtr a = arg_buffer(info, 0, "a"), b = arg_buffer(info, 1, "b"), c = arg_buffer(info, 2, "c");
  same_length(env, "triad", a, b);
  same_length(env, "triad", a, c);
  // The buffers hold doubles: two floats' worth of aligned memory each.
  if (a->size() % 2 != 0) throw_error(env, "ERR_INVALID_ARGUMENT", "triad: the buffers hold doubles; their float length must be even");
  auto as_double = [](const BufferPtr& p) { return reinterpret_cast<double*>(p->data()); };
  check(env, sapipe_cpu_triad(as_double(a), as_double(b), as_double(c), a->size() / 2, arg_float(info, 3, "s")), "triad");
  return env.Undefined();
}

Napi::Value Copy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  BufferPtr dst = arg_buffer(info, 0, "dst"), src = arg_buffer(info, 1, "src");
  same_length(env, "copy", dst, src);
  if (dst == src) return env.Undefined();
  check(env, sapipe_cpu_copy(dst->data(), src->data(), dst->size()), "copy");
  return env.Undefined();
}

}  // namespace

void InitKernels(Napi::Env env, Napi::Object exports) {
  exports.Set("elasticAverage", Napi::Function::New(env, ElasticAverage, "elasticAverage"));
  exports.Set("sum", Napi::Function::New(env, Sum, "sum"));
  exports.Set("scale", Napi::Function::New(env, Scale, "scale"));
  exports.Set("axpy", Napi::Function::New(env, Axpy, "axpy"));
  exports.Set("squaredNorm", Napi::Function::New(env, SquaredNorm, "squaredNorm"));
  exports.Set("countNonFinite", Napi::Function::New(env, CountNonFinite, "countNonFinite"));
  exports.Set("triad", Napi::Function::New(env, Triad, "triad"));
  exports.Set("copy", Napi::Function::New(env, Copy, "copy"));
}

}  // namespace sapipe::addon
