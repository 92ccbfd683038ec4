// NativeBuffer: a 64-byte aligned fp32 buffer owned by native code, seen from JS as a zero-copy
// Float32Array. dispose() detaches the array (every view becomes empty) and frees the memory at
// once, unless an operation in flight still uses it (ERR_BUSY).
#pragma once

#include <napi.h>

#include <memory>

#include "../core/aligned_buffer.h"

namespace sapipe::addon {

class NativeBuffer : public Napi::ObjectWrap<NativeBuffer> {
 public:
  static void Init(Napi::Env env, Napi::Object exports);
  // The NativeBuffer behind a JS value, or a thrown ERR_INVALID_ARGUMENT / ERR_DISPOSED naming `what`.
  static std::shared_ptr<AlignedBuffer> FromValue(Napi::Env env, const Napi::Value& value, const char* what);
  static bool IsInstance(const Napi::Value& value);
  // A JS NativeBuffer over memory allocated elsewhere (AlignedBuffer::adopt).
  static Napi::Object Wrap(Napi::Env env, std::shared_ptr<AlignedBuffer> buffer);

  explicit NativeBuffer(const Napi::CallbackInfo& info);

 private:
  void AllocateOwn(const Napi::CallbackInfo& info);
  Napi::Value GetArray(const Napi::CallbackInfo& info);
  Napi::Value GetLength(const Napi::CallbackInfo& info);
  Napi::Value GetDisposed(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);

  std::shared_ptr<AlignedBuffer> buffer_;
  Napi::Reference<Napi::ArrayBuffer> array_buffer_;
  Napi::Reference<Napi::Float32Array> array_;
};

}  // namespace sapipe::addon
