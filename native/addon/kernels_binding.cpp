// Elementwise kernels on whole NativeBuffers: elastic averaging, reductions, and the bandwidth
// references that benchmarks measure against. All are synchronous: they are building blocks
// that the runtimes call between steps, and each costs one native call.
#include <cmath>
#include <functional>
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

size_t arg_count(const Napi::CallbackInfo& info, size_t index, const char* what, size_t max) {
  if (!info[index].IsNumber()) throw_error(info.Env(), "ERR_INVALID_ARGUMENT", std::string(what) + " must be a number");
  const double v = info[index].As<Napi::Number>().DoubleValue();
  if (!(v >= 0) || v > static_cast<double>(max) || v != std::floor(v))
    throw_error(info.Env(), "ERR_INVALID_ARGUMENT", std::string(what) + " must be an integer in [0, " + std::to_string(max) + "]");
  return static_cast<size_t>(v);
}

Napi::Object pairs(Napi::Env env, size_t k, const std::function<sapipe_status(int32_t*, float*)>& fill, const char* op) {
  Napi::Int32Array indices = Napi::Int32Array::New(env, k);
  Napi::Float32Array values = Napi::Float32Array::New(env, k);
  check(env, fill(indices.Data(), values.Data()), op);
  Napi::Object out = Napi::Object::New(env);
  out.Set("indices", indices);
  out.Set("values", values);
  return out;
}

// topkSelect(grad, residual | null, k, rounds): { indices, values, passes, lower, upper, band }.
Napi::Value TopkSelect(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  BufferPtr grad = arg_buffer(info, 0, "grad");
  BufferPtr residual = info[1].IsNull() || info[1].IsUndefined() ? nullptr : arg_buffer(info, 1, "residual");
  if (residual) {
    same_length(env, "topkSelect", grad, residual);
    if (residual == grad) throw_error(env, "ERR_ALIASING", "topkSelect: grad and residual must be different buffers");
  }
  if (grad->size() > static_cast<size_t>(INT32_MAX)) throw_error(env, "ERR_INVALID_ARGUMENT", "topkSelect: at most 2^31-1 elements (indices are int32)");
  const size_t k = arg_count(info, 2, "k", grad->size());
  const size_t rounds = arg_count(info, 3, "rounds", 64);
  // Refused before anything is written: a NaN/Inf has no place in a ranking, and the residual stays as it was.
  int64_t bad = 0;
  check(env, sapipe_cpu_count_non_finite(grad->data(), grad->size(), &bad), "topkSelect");
  if (bad > 0) throw_error(env, "ERR_INVALID_ARGUMENT", "topkSelect: the gradient holds " + std::to_string(bad) + " NaN/Inf element(s); skip this step (the residual is unchanged)");
  sapipe_topk_stats stats{};
  Napi::Object out = pairs(env, k, [&](int32_t* idx, float* val) {
    return sapipe_cpu_topk_select(grad->data(), residual ? residual->data() : nullptr, grad->size(), k, static_cast<int32_t>(rounds), idx, val, &stats);
  }, "topkSelect");
  out.Set("passes", Napi::Number::New(env, stats.passes));
  out.Set("lower", Napi::Number::New(env, stats.lower));
  out.Set("upper", Napi::Number::New(env, stats.upper));
  out.Set("band", Napi::Number::New(env, static_cast<double>(stats.band)));
  return out;
}

Napi::Value TopkExact(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  BufferPtr x = arg_buffer(info, 0, "x");
  if (x->size() > static_cast<size_t>(INT32_MAX)) throw_error(env, "ERR_INVALID_ARGUMENT", "topkExact: at most 2^31-1 elements (indices are int32)");
  const size_t k = arg_count(info, 1, "k", x->size());
  return pairs(env, k, [&](int32_t* idx, float* val) { return sapipe_cpu_topk_exact(x->data(), x->size(), k, idx, val); }, "topkExact");
}

// scatterAdd(out, indices: Int32Array, values: Float32Array, scale)
Napi::Value ScatterAdd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  BufferPtr out = arg_buffer(info, 0, "out");
  if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
    throw_error(env, "ERR_INVALID_ARGUMENT", "scatterAdd: indices must be an Int32Array");
  if (!info[2].IsTypedArray() || info[2].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
    throw_error(env, "ERR_INVALID_ARGUMENT", "scatterAdd: values must be a Float32Array");
  Napi::Int32Array indices = info[1].As<Napi::Int32Array>();
  Napi::Float32Array values = info[2].As<Napi::Float32Array>();
  if (indices.ElementLength() != values.ElementLength())
    throw_error(env, "ERR_SIZE_MISMATCH", "scatterAdd: " + std::to_string(indices.ElementLength()) + " indices but " + std::to_string(values.ElementLength()) + " values");
  const sapipe_status s = sapipe_cpu_scatter_add(out->data(), out->size(), indices.Data(), values.Data(), indices.ElementLength(), arg_float(info, 3, "scale"));
  if (s == SAPIPE_ERR_INVALID_ARGUMENT) throw_error(env, "ERR_INVALID_ARGUMENT", "scatterAdd: an index is outside [0, " + std::to_string(out->size()) + "); nothing was added");
  check(env, s, "scatterAdd");
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
  exports.Set("topkSelect", Napi::Function::New(env, TopkSelect, "topkSelect"));
  exports.Set("topkExact", Napi::Function::New(env, TopkExact, "topkExact"));
  exports.Set("scatterAdd", Napi::Function::New(env, ScatterAdd, "scatterAdd"));
}

}  // namespace sapipe::addon
