#include "native_buffer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "addon_data.h"
#include "errors.h"

namespace sapipe::addon {

void NativeBuffer::Init(Napi::Env env, Napi::Object exports) {
  Napi::Function ctor = DefineClass(env, "NativeBuffer",
                                    {InstanceAccessor<&NativeBuffer::GetArray>("array"),
                                     InstanceAccessor<&NativeBuffer::GetLength>("length"),
                                     InstanceAccessor<&NativeBuffer::GetDisposed>("disposed"),
                                     InstanceMethod<&NativeBuffer::Dispose>("dispose"),
                                     InstanceMethod<&NativeBuffer::View>("view"),
                                     StaticValue("maxViewLength", Napi::Number::New(env, static_cast<double>(kMaxViewElements)))});
  AddonData::Get(env).native_buffer_ctor = Napi::Persistent(ctor);
  exports.Set("NativeBuffer", ctor);
}

bool NativeBuffer::IsInstance(const Napi::Value& value) {
  if (!value.IsObject()) return false;
  return value.As<Napi::Object>().InstanceOf(AddonData::Get(value.Env()).native_buffer_ctor.Value());
}

std::shared_ptr<AlignedBuffer> NativeBuffer::FromValue(Napi::Env env, const Napi::Value& value, const char* what) {
  if (!IsInstance(value)) throw_error(env, "ERR_INVALID_ARGUMENT", std::string(what) + " must be a NativeBuffer");
  NativeBuffer* self = Napi::ObjectWrap<NativeBuffer>::Unwrap(value.As<Napi::Object>());
  if (!self->buffer_ || self->buffer_->disposed())
    throw_error(env, "ERR_DISPOSED", std::string(what) + " was disposed; allocate a new buffer");
  return self->buffer_;
}

Napi::Object NativeBuffer::Wrap(Napi::Env env, std::shared_ptr<AlignedBuffer> buffer) {
  auto* holder = new std::shared_ptr<AlignedBuffer>(std::move(buffer));
  auto external = Napi::External<std::shared_ptr<AlignedBuffer>>::New(
      env, holder, [](Napi::Env, std::shared_ptr<AlignedBuffer>* h) { delete h; });
  return AddonData::Get(env).native_buffer_ctor.Value().New({external});
}

NativeBuffer::NativeBuffer(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NativeBuffer>(info) {
  Napi::Env env = info.Env();
  if (info.Length() >= 1 && info[0].IsExternal()) {
    buffer_ = *info[0].As<Napi::External<std::shared_ptr<AlignedBuffer>>>().Data();
  } else {
    AllocateOwn(info);
  }
  accounted_bytes_ = static_cast<int64_t>(buffer_->size() * sizeof(float));
  Napi::MemoryManagement::AdjustExternalMemory(env, accounted_bytes_);
  if (buffer_->size() <= kMaxViewElements) {
    Napi::ArrayBuffer ab = ExternalRange(env, 0, buffer_->size());
    array_buffer_ = Napi::Persistent(ab);
    array_ = Napi::Persistent(Napi::Float32Array::New(env, buffer_->size(), ab, 0));
  }
}

NativeBuffer::~NativeBuffer() { ReleaseAccounting(); }

void NativeBuffer::ReleaseAccounting() {
  if (accounted_bytes_ == 0) return;
  Napi::MemoryManagement::AdjustExternalMemory(Env(), -accounted_bytes_);
  accounted_bytes_ = 0;
}

Napi::ArrayBuffer NativeBuffer::ExternalRange(Napi::Env env, size_t offset, size_t length) {
  // Never ask Node-API for more than it can hold: past 2^32 bytes napi_create_external_arraybuffer
  // fails after it has already run the finalizer, and node-addon-api then frees the finalizer's data
  // a second time (the heap corruption once seen here for buffers above 2^30 floats).
  if (length > kMaxViewElements || offset > buffer_->size() || length > buffer_->size() - offset)
    throw_error(env, "ERR_INTERNAL", "NativeBuffer: a view range past the view limit or the buffer");
  // The ArrayBuffer shares ownership: a view that outlives this wrapper keeps the memory alive.
  auto* holder = new std::shared_ptr<AlignedBuffer>(buffer_);
  return Napi::ArrayBuffer::New(
      env, buffer_->data() + offset, length * sizeof(float),
      [](Napi::Env, void*, std::shared_ptr<AlignedBuffer>* h) { delete h; }, holder);
}

void NativeBuffer::AllocateOwn(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsNumber())
    throw_error(env, "ERR_INVALID_ARGUMENT", "NativeBuffer(length): length must be a number");
  double length = info[0].As<Napi::Number>().DoubleValue();
  // Any length a JS number holds exactly; the machine's memory is the real limit (ERR_OUT_OF_MEMORY).
  if (!std::isfinite(length) || length < 0 || std::floor(length) != length || length > 9007199254740991.0)
    throw_error(env, "ERR_INVALID_ARGUMENT",
                "NativeBuffer(length): length must be an integer in [0, 2^53 - 1]");
  buffer_ = AlignedBuffer::allocate(static_cast<size_t>(length));
  if (!buffer_)
    throw_error(env, "ERR_OUT_OF_MEMORY",
                "NativeBuffer: cannot allocate " + std::to_string(static_cast<size_t>(length)) +
                    " floats; free memory (dispose() buffers no longer needed) or use a smaller model");
}

Napi::Value NativeBuffer::GetArray(const Napi::CallbackInfo& info) {
  if (!buffer_ || buffer_->disposed())
    throw_error(info.Env(), "ERR_DISPOSED", "NativeBuffer.array: the buffer was disposed");
  if (array_.IsEmpty())
    throw_error(info.Env(), "ERR_VIEW_TOO_LARGE",
                "NativeBuffer.array: " + std::to_string(buffer_->size()) +
                    " floats are more than one JavaScript view can hold (2^30); use view(offset, length)");
  return array_.Value();
}

Napi::Value NativeBuffer::View(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!buffer_ || buffer_->disposed()) throw_error(env, "ERR_DISPOSED", "NativeBuffer.view: the buffer was disposed");
  auto index = [&](size_t i, const char* what) {
    double v = info.Length() > i && info[i].IsNumber() ? info[i].As<Napi::Number>().DoubleValue() : -1.0;
    if (!std::isfinite(v) || v < 0 || std::floor(v) != v || v > static_cast<double>(buffer_->size()))
      throw_error(env, "ERR_INVALID_ARGUMENT",
                  std::string("NativeBuffer.view: ") + what + " must be an integer in [0, " + std::to_string(buffer_->size()) + "]");
    return static_cast<size_t>(v);
  };
  size_t offset = index(0, "offset");
  size_t length = index(1, "length");
  if (length > buffer_->size() - offset)
    throw_error(env, "ERR_INVALID_ARGUMENT", "NativeBuffer.view: offset + length runs past the buffer");
  if (length > kMaxViewElements)
    throw_error(env, "ERR_VIEW_TOO_LARGE",
                "NativeBuffer.view: " + std::to_string(length) + " floats are more than one JavaScript view can hold (2^30)");
  if (!array_buffer_.IsEmpty()) return Napi::Float32Array::New(env, length, array_buffer_.Value(), offset * sizeof(float));
  // Drop the references of views already collected so the list stays as long as the live ones.
  range_views_.erase(std::remove_if(range_views_.begin(), range_views_.end(),
                                    [](const Napi::Reference<Napi::ArrayBuffer>& r) { return r.Value().IsEmpty(); }),
                     range_views_.end());
  Napi::ArrayBuffer ab = ExternalRange(env, offset, length);
  range_views_.push_back(Napi::Weak(ab));
  return Napi::Float32Array::New(env, length, ab, 0);
}

Napi::Value NativeBuffer::GetLength(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), buffer_ ? static_cast<double>(buffer_->size()) : 0.0);
}

Napi::Value NativeBuffer::GetDisposed(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), !buffer_ || buffer_->disposed());
}

Napi::Value NativeBuffer::Dispose(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!buffer_ || buffer_->disposed()) return env.Undefined();  // idempotent
  if (buffer_->in_use())
    throw_error(env, "ERR_BUSY", "NativeBuffer.dispose(): an asynchronous operation still uses it; await it first");
  if (!array_buffer_.IsEmpty()) array_buffer_.Value().Detach();
  for (auto& view : range_views_) {
    Napi::ArrayBuffer ab = view.Value();
    if (!ab.IsEmpty()) ab.Detach();
  }
  range_views_.clear();
  buffer_->free_storage();
  array_.Reset();
  array_buffer_.Reset();
  ReleaseAccounting();
  return env.Undefined();
}

}  // namespace sapipe::addon
