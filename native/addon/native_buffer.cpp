#include "native_buffer.h"

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
                                     InstanceMethod<&NativeBuffer::Dispose>("dispose")});
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
  // The ArrayBuffer shares ownership: a view that outlives this wrapper keeps the memory alive.
  auto* holder = new std::shared_ptr<AlignedBuffer>(buffer_);
  Napi::ArrayBuffer ab = Napi::ArrayBuffer::New(
      env, buffer_->data(), buffer_->size() * sizeof(float),
      [](Napi::Env, void*, std::shared_ptr<AlignedBuffer>* h) { delete h; }, holder);
  array_buffer_ = Napi::Persistent(ab);
  array_ = Napi::Persistent(Napi::Float32Array::New(env, buffer_->size(), ab, 0));
}

void NativeBuffer::AllocateOwn(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsNumber())
    throw_error(env, "ERR_INVALID_ARGUMENT", "NativeBuffer(length): length must be a number");
  double length = info[0].As<Napi::Number>().DoubleValue();
  // Float32Array lengths are limited by the engine; 2^32 elements (16 GiB) is far beyond any
  // single tensor this package is meant for.
  if (!std::isfinite(length) || length < 0 || std::floor(length) != length || length > 4294967295.0)
    throw_error(env, "ERR_INVALID_ARGUMENT",
                "NativeBuffer(length): length must be an integer in [0, 2^32 - 1]");
  buffer_ = AlignedBuffer::allocate(static_cast<size_t>(length));
  if (!buffer_) throw_error(env, "ERR_OUT_OF_MEMORY", "NativeBuffer: cannot allocate " + std::to_string(length) + " floats");
}

Napi::Value NativeBuffer::GetArray(const Napi::CallbackInfo& info) {
  if (!buffer_ || buffer_->disposed())
    throw_error(info.Env(), "ERR_DISPOSED", "NativeBuffer.array: the buffer was disposed");
  return array_.Value();
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
  if (buffer_->busy())
    throw_error(env, "ERR_BUSY", "NativeBuffer.dispose(): an asynchronous operation still uses it; await it first");
  Napi::ArrayBuffer ab = array_buffer_.Value();
  ab.Detach();
  buffer_->free_storage();
  array_.Reset();
  array_buffer_.Reset();
  return env.Undefined();
}

}  // namespace sapipe::addon
