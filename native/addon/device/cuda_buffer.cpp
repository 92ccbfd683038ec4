#include "cuda_buffer.h"

#include <cmath>
#include <string>
#include <vector>

#include "../addon_data.h"
#include "../errors.h"
#include "../js_args.h"
#include "../update_binding.h"
#include "cuda_binding.h"

namespace sapipe::addon {
namespace {

Napi::Float32Array float32_arg(Napi::Env env, const Napi::Value& v, const char* what) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
    throw_error(env, "ERR_INVALID_ARGUMENT", std::string(what) + " must be a Float32Array");
  return v.As<Napi::Float32Array>();
}

void check_status(Napi::Env env, const sapipe_cuda_plugin_v1* cuda, sapipe_status s, const char* what) {
  if (s != SAPIPE_OK) throw_error(env, sapipe_status_code(s), std::string(what) + ": " + cuda->last_error());
}

}  // namespace

void CudaBuffer::Init(Napi::Env env, Napi::Object exports) {
  Napi::Function ctor = DefineClass(env, "CudaBuffer",
                                    {InstanceAccessor<&CudaBuffer::GetLength>("length"),
                                     InstanceAccessor<&CudaBuffer::GetDevice>("device"),
                                     InstanceAccessor<&CudaBuffer::GetDisposed>("disposed"),
                                     InstanceMethod<&CudaBuffer::CopyFromHost>("copyFromHost"),
                                     InstanceMethod<&CudaBuffer::CopyToHost>("copyToHost"),
                                     InstanceMethod<&CudaBuffer::CopyFromDevice>("copyFromDevice"),
                                     InstanceMethod<&CudaBuffer::Dispose>("dispose")});
  AddonData::Get(env).cuda_buffer_ctor = Napi::Persistent(ctor);
  exports.Set("CudaBuffer", ctor);
}

std::shared_ptr<DeviceAllocation> CudaBuffer::FromValue(Napi::Env env, const Napi::Value& value, const char* what) {
  if (!value.IsObject() || !value.As<Napi::Object>().InstanceOf(AddonData::Get(env).cuda_buffer_ctor.Value()))
    throw_error(env, "ERR_INVALID_ARGUMENT", std::string(what) + " must be a CudaBuffer");
  CudaBuffer* self = Napi::ObjectWrap<CudaBuffer>::Unwrap(value.As<Napi::Object>());
  if (!self->memory_) throw_error(env, "ERR_DISPOSED", std::string(what) + " was disposed; allocate a new buffer");
  return self->memory_;
}

// new CudaBuffer(device, length): `length` zero-filled floats on cuda:device.
CudaBuffer::CudaBuffer(const Napi::CallbackInfo& info) : Napi::ObjectWrap<CudaBuffer>(info) {
  Napi::Env env = info.Env();
  if (!info[0].IsNumber() || !whole_in(info[0].As<Napi::Number>().DoubleValue(), 0, 1023))
    throw_error(env, "ERR_INVALID_ARGUMENT", "CudaBuffer(device, length): device must be an integer in [0, 1023]");
  if (!info[1].IsNumber() || !whole_in(info[1].As<Napi::Number>().DoubleValue(), 0, 4294967295.0))
    throw_error(env, "ERR_INVALID_ARGUMENT", "CudaBuffer(device, length): length must be an integer in [0, 2^32 - 1]");
  device_ = static_cast<int32_t>(info[0].As<Napi::Number>().DoubleValue());
  length_ = static_cast<size_t>(info[1].As<Napi::Number>().DoubleValue());
  const sapipe_cuda_plugin_v1* cuda = require_device_table(env, device_);
  std::string detail;
  if (sapipe_status s = DeviceAllocation::allocate(cuda, device_, length_, &memory_, &detail); s != SAPIPE_OK)
    throw_error(env, sapipe_status_code(s), "CudaBuffer: " + detail);
}

DeviceAllocation& CudaBuffer::live(Napi::Env env, const char* what) {
  if (!memory_) throw_error(env, "ERR_DISPOSED", std::string("CudaBuffer.") + what + ": the buffer was disposed");
  if (memory_->users.load() != 0)
    throw_error(env, "ERR_BUSY", std::string("CudaBuffer.") + what + ": a queued operation still uses the buffer; await it first");
  if (memory_->cuda->set_device(device_) != SAPIPE_OK)
    throw_error(env, "ERR_BACKEND_UNAVAILABLE", device_unavailable(device_, memory_->cuda));
  return *memory_;
}

Napi::Value CudaBuffer::GetLength(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), static_cast<double>(length_)); }
Napi::Value CudaBuffer::GetDevice(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), device_); }
Napi::Value CudaBuffer::GetDisposed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), !memory_); }

// copyFromHost(src: Float32Array, offset): device [offset, offset + src.length) = src.
Napi::Value CudaBuffer::CopyFromHost(const Napi::CallbackInfo& info) { return CopyHost(info, true); }
// copyToHost(dst: Float32Array, offset): dst = device [offset, offset + dst.length).
Napi::Value CudaBuffer::CopyToHost(const Napi::CallbackInfo& info) { return CopyHost(info, false); }

Napi::Value CudaBuffer::CopyHost(const Napi::CallbackInfo& info, bool to_device) {
  Napi::Env env = info.Env();
  const std::string what = to_device ? "copyFromHost" : "copyToHost";
  DeviceAllocation& m = live(env, what.c_str());
  Napi::Float32Array host = float32_arg(env, info[0], (what + (to_device ? "(src)" : "(dst)")).c_str());
  const size_t offset = index_arg(env, info[1], (what + "(offset)").c_str());
  const size_t n = host.ElementLength();
  if (offset > m.length || n > m.length - offset)
    throw_error(env, "ERR_SIZE_MISMATCH", what + ": " + std::to_string(n) + " floats at offset " + std::to_string(offset) +
                                              " exceed the buffer's " + std::to_string(m.length));
  if (n == 0) return env.Undefined();
  std::string detail;
  // On the device's current stream (a pipeline stage's), behind the work that produced or still
  // reads the memory there.
  void* stream = AddonData::Get(env).current_stream(m.device);
  const sapipe_status s = to_device ? copy_to_device_sync(m.cuda, m.data + offset, host.Data(), n, &detail, stream)
                                    : copy_to_host_sync(m.cuda, host.Data(), m.data + offset, n, &detail, stream);
  if (s != SAPIPE_OK) throw_error(env, sapipe_status_code(s), what + ": " + detail);
  return env.Undefined();
}

// copyFromDevice(src: CudaBuffer, srcOffset, dstOffset, count, enqueueOnly?), both on this buffer's
// device. enqueueOnly, or a current stream (CudaStream.run's): the copy is enqueued on the device's
// current stream (else the legacy default one), in order with the model operations there, and not
// waited for (a step that reads the copy waits for an event recorded after it; a stage's later
// operations are on the same stream).
Napi::Value CudaBuffer::CopyFromDevice(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  DeviceAllocation& m = live(env, "copyFromDevice");
  std::shared_ptr<DeviceAllocation> src = FromValue(env, info[0], "copyFromDevice(src)");
  const size_t from = index_arg(env, info[1], "copyFromDevice(srcOffset)");
  const size_t to = index_arg(env, info[2], "copyFromDevice(dstOffset)");
  const size_t count = index_arg(env, info[3], "copyFromDevice(count)");
  if (src->device != m.device) throw_error(env, "ERR_INVALID_ARGUMENT", "copyFromDevice: the buffers are on different devices");
  if (src->users.load() != 0) throw_error(env, "ERR_BUSY", "copyFromDevice: a queued operation still uses the source; await it first");
  if (from > src->length || count > src->length - from || to > m.length || count > m.length - to)
    throw_error(env, "ERR_SIZE_MISMATCH", "copyFromDevice: the range exceeds a buffer");
  if (count == 0) return env.Undefined();
  if (src.get() == &m) throw_error(env, "ERR_ALIASING", "copyFromDevice: the source and destination are the same buffer");
  void* stream = AddonData::Get(env).current_stream(m.device);
  if (stream != nullptr || info[4].ToBoolean().Value()) {
    if (sapipe_status s = m.cuda->copy_on_device(m.data + to, src->data + from, count * sizeof(float), stream); s != SAPIPE_OK)
      throw_error(env, sapipe_status_code(s), std::string("copyFromDevice: ") + m.cuda->last_error());
    return env.Undefined();
  }
  std::string detail;
  if (sapipe_status s = copy_on_device_sync(m.cuda, m.data + to, src->data + from, count, &detail); s != SAPIPE_OK)
    throw_error(env, sapipe_status_code(s), "copyFromDevice: " + detail);
  return env.Undefined();
}

Napi::Value CudaBuffer::Dispose(const Napi::CallbackInfo& info) {
  if (memory_ && memory_->users.load() != 0)
    throw_error(info.Env(), "ERR_BUSY", "CudaBuffer.dispose: a queued operation still uses the buffer; await it first");
  memory_.reset();
  return info.Env().Undefined();
}

DeviceUpdate parse_device_update(Napi::Env env, const Napi::Value& value, int32_t device, bool refuse_busy) {
  DeviceUpdate out;
  Napi::Object b = expect_object(env, value, "buffers");
  std::shared_ptr<DeviceAllocation> weights = CudaBuffer::FromValue(env, b.Get("weights"), "buffers.weights");
  const int32_t on = device < 0 ? weights->device : device;
  auto take = [&](const std::shared_ptr<DeviceAllocation>& m, const std::string& what) {
    if (m->device != on)
      throw_error(env, "ERR_INVALID_ARGUMENT", what + " is on cuda:" + std::to_string(m->device) + ", not cuda:" + std::to_string(on));
    if (m->length != weights->length)
      throw_error(env, "ERR_SIZE_MISMATCH", what + " has " + std::to_string(m->length) + " elements but buffers.weights has " +
                                                std::to_string(weights->length));
    if (refuse_busy && m->users.load() != 0) throw_error(env, "ERR_BUSY", what + " is in use by a queued operation; await it first");
    out.held.push_back(m);
    return m->data;
  };
  auto optional = [&](const char* key) -> float* {
    Napi::Value v = b.Get(key);
    if (v.IsUndefined() || v.IsNull()) return nullptr;
    const std::string what = std::string("buffers.") + key;
    return take(CudaBuffer::FromValue(env, v, what.c_str()), what);
  };
  float* w = take(weights, "buffers.weights");
  out.buffers = read_update_buffers(env, b, w, weights->length, optional);
  return out;
}

namespace {

// cudaUpdate(config, buffers): the fused update on CudaBuffers (the keys of NativeUpdateBuffers),
// run to completion on the weights' device; returns { applied, nonFiniteCount }.
Napi::Value CudaUpdate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const sapipe_update_config config = parse_update_config(expect_object(env, info[0], "config"));
  // Run now, on the device's current stream (a pipeline stage's, behind the backward that wrote
  // the gradients), else the legacy one: no queued collective may be using the memory.
  const DeviceUpdate update = parse_device_update(env, info[1], -1, true);
  const sapipe_update_buffers& buffers = update.buffers;
  const int32_t device = update.held.front()->device;
  const sapipe_cuda_plugin_v1* cuda = require_device_table(env, device);
  sapipe_update_result result{};
  check_status(env, cuda, cuda->update(&config, &buffers, nullptr, &result, AddonData::Get(env).current_stream(device)), "cudaUpdate");
  Napi::Object o = Napi::Object::New(env);
  o.Set("applied", Napi::Boolean::New(env, result.applied != 0));
  o.Set("nonFiniteCount", Napi::Number::New(env, static_cast<double>(result.non_finite_count)));
  return o;
}

// cudaCountNonFinite(buffer, offset, count): NaN/Inf elements of the range, counted on the device
// (a device word allocated per call: the call is not on a step's hot path).
Napi::Value CudaCountNonFinite(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::shared_ptr<DeviceAllocation> m = CudaBuffer::FromValue(env, info[0], "cudaCountNonFinite(buffer)");
  const size_t offset = index_arg(env, info[1], "cudaCountNonFinite(offset)");
  const size_t count = index_arg(env, info[2], "cudaCountNonFinite(count)");
  if (offset > m->length || count > m->length - offset)
    throw_error(env, "ERR_SIZE_MISMATCH", "cudaCountNonFinite: the range exceeds the buffer");
  if (m->users.load() != 0) throw_error(env, "ERR_BUSY", "cudaCountNonFinite: a queued operation still uses the buffer");
  const sapipe_cuda_plugin_v1* cuda = require_device_table(env, m->device);
  int64_t bad = 0;
  std::string detail;
  if (sapipe_status s = count_non_finite_on_device(cuda, m->data + offset, count, &bad, &detail); s != SAPIPE_OK)
    throw_error(env, sapipe_status_code(s), "cudaCountNonFinite: " + detail);
  return Napi::Number::New(env, static_cast<double>(bad));
}

// cudaTopkSelect(grad, residual | null, k, rounds, pack): MSTopK of grad (+ residual, formed in
// place there) into pack (2k + 1 floats: the k indices as int32 bits, then the k values; the last
// float is the caller's), the selection zeroed in the residual; run to completion. Returns the
// search's { passes, lower, upper, band }. grad must be finite (countNonFinite first).
Napi::Value CudaTopkSelect(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::shared_ptr<DeviceAllocation> grad = CudaBuffer::FromValue(env, info[0], "cudaTopkSelect(grad)");
  std::shared_ptr<DeviceAllocation> residual =
      info[1].IsNull() ? nullptr : CudaBuffer::FromValue(env, info[1], "cudaTopkSelect(residual)");
  const size_t k = index_arg(env, info[2], "cudaTopkSelect(k)");
  const size_t rounds = index_arg(env, info[3], "cudaTopkSelect(rounds)");
  std::shared_ptr<DeviceAllocation> pack = CudaBuffer::FromValue(env, info[4], "cudaTopkSelect(pack)");
  if (k > grad->length || pack->length < 2 * k || (residual && residual->length != grad->length) || rounds > 64)
    throw_error(env, "ERR_SIZE_MISMATCH", "cudaTopkSelect: k must be at most the gradient's length, the pack hold 2k floats and the residual match the gradient");
  if (pack == grad || pack == residual || residual == grad)
    throw_error(env, "ERR_ALIASING", "cudaTopkSelect: the gradient, the residual and the pack must be different buffers");
  for (const auto* m : {grad.get(), residual.get(), pack.get()})
    if (m != nullptr && (m->device != grad->device || m->users.load() != 0))
      throw_error(env, "ERR_BUSY", "cudaTopkSelect: every buffer must be on the gradient's device and not in use by a queued operation");
  const sapipe_cuda_plugin_v1* cuda = require_device_table(env, grad->device);
  sapipe_topk_stats stats{};
  check_status(env, cuda,
               cuda->topk_select(grad->data, residual ? residual->data : nullptr, grad->length, k, static_cast<int32_t>(rounds),
                                 reinterpret_cast<int32_t*>(pack->data), pack->data + k, &stats, nullptr),
               "cudaTopkSelect");
  Napi::Object o = Napi::Object::New(env);
  o.Set("passes", Napi::Number::New(env, stats.passes));
  o.Set("lower", Napi::Number::New(env, stats.lower));
  o.Set("upper", Napi::Number::New(env, stats.upper));
  o.Set("band", Napi::Number::New(env, static_cast<double>(stats.band)));
  return o;
}

// cudaScatterAdd(out, all, width, k, ranks, scale, zeroFirst): out = (zeroFirst ? 0 : out) plus
// scale times the pairs of every rank's pack in `all` (rank r's at r * width: k int32 indices, k
// values), ranks in order; run to completion. An index out of range is ERR_INTERNAL (a corrupt pack).
Napi::Value CudaScatterAdd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::shared_ptr<DeviceAllocation> out = CudaBuffer::FromValue(env, info[0], "cudaScatterAdd(out)");
  std::shared_ptr<DeviceAllocation> all = CudaBuffer::FromValue(env, info[1], "cudaScatterAdd(all)");
  const size_t width = index_arg(env, info[2], "cudaScatterAdd(width)");
  const size_t k = index_arg(env, info[3], "cudaScatterAdd(k)");
  const size_t ranks = index_arg(env, info[4], "cudaScatterAdd(ranks)");
  if (!info[5].IsNumber()) throw_error(env, "ERR_INVALID_ARGUMENT", "cudaScatterAdd(scale) must be a number");
  const float scale = static_cast<float>(info[5].As<Napi::Number>().DoubleValue());
  const bool zero_first = info[6].ToBoolean().Value();
  if (2 * k > width || ranks == 0 || width * ranks > all->length)
    throw_error(env, "ERR_SIZE_MISMATCH", "cudaScatterAdd: `all` must hold ranks packs of width >= 2k floats");
  if (out == all) throw_error(env, "ERR_ALIASING", "cudaScatterAdd: out and the gathered packs must be different buffers");
  if (out->device != all->device || out->users.load() != 0 || all->users.load() != 0)
    throw_error(env, "ERR_BUSY", "cudaScatterAdd: both buffers must be on one device and not in use by a queued operation");
  const sapipe_cuda_plugin_v1* cuda = require_device_table(env, out->device);
  int64_t bad = 0;
  std::string detail;
  if (sapipe_status s = scatter_add_packs_on_device(cuda, out->data, out->length, all->data, width, k, ranks, scale, zero_first, &bad, &detail);
      s != SAPIPE_OK)
    throw_error(env, sapipe_status_code(s), "cudaScatterAdd: " + detail);
  if (bad != 0) throw_error(env, "ERR_INTERNAL", "cudaScatterAdd: " + std::to_string(bad) + " index(es) outside the buffer: a corrupt pack");
  return env.Undefined();
}

}  // namespace

void InitCudaBuffer(Napi::Env env, Napi::Object exports) {
  CudaBuffer::Init(env, exports);
  exports.Set("cudaUpdate", Napi::Function::New(env, CudaUpdate, "cudaUpdate"));
  exports.Set("cudaCountNonFinite", Napi::Function::New(env, CudaCountNonFinite, "cudaCountNonFinite"));
  exports.Set("cudaTopkSelect", Napi::Function::New(env, CudaTopkSelect, "cudaTopkSelect"));
  exports.Set("cudaScatterAdd", Napi::Function::New(env, CudaScatterAdd, "cudaScatterAdd"));
}

}  // namespace sapipe::addon
