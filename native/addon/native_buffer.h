// NativeBuffer: a 64-byte aligned fp32 buffer owned by native code, seen from JS as zero-copy
// Float32Arrays. dispose() detaches every array it handed out (they become empty) and frees the
// memory at once, unless an operation in flight still uses it (ERR_BUSY).
//
// One JS view covers at most kMaxViewElements floats: Node-API's external ArrayBuffers are capped at
// buffer.constants.MAX_LENGTH (2^32 bytes). A larger buffer has no whole-buffer `array` (ERR_VIEW_TOO_LARGE);
// it hands out views of ranges within the cap (`view(offset, length)`), while native kernels and
// collectives still take the whole buffer.
//
// The memory is reported to the engine (Node-API external-memory accounting) so that buffers
// dropped without dispose() are collected under memory pressure, as ordinary ArrayBuffers are.
#pragma once

#include <napi.h>

#include <cstddef>
#include <memory>
#include <vector>

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

  // Floats one JS view can hold: 2^30 (4 GiB), Node's limit for an external ArrayBuffer.
  static constexpr size_t kMaxViewElements = size_t{1} << 30;

  explicit NativeBuffer(const Napi::CallbackInfo& info);
  ~NativeBuffer() override;

 private:
  void AllocateOwn(const Napi::CallbackInfo& info);
  Napi::Value GetArray(const Napi::CallbackInfo& info);
  Napi::Value GetLength(const Napi::CallbackInfo& info);
  Napi::Value GetDisposed(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  Napi::Value View(const Napi::CallbackInfo& info);

  // An ArrayBuffer over elements [offset, offset + length) that shares ownership of the memory.
  Napi::ArrayBuffer ExternalRange(Napi::Env env, size_t offset, size_t length);
  // Stops reporting this buffer's bytes to the engine (at dispose, or when the wrapper is collected).
  void ReleaseAccounting();

  std::shared_ptr<AlignedBuffer> buffer_;
  Napi::Reference<Napi::ArrayBuffer> array_buffer_;  // empty when the buffer exceeds one view
  Napi::Reference<Napi::Float32Array> array_;
  // Range views of a buffer too large for one view, held weakly: dispose() detaches the live ones.
  std::vector<Napi::Reference<Napi::ArrayBuffer>> range_views_;
  int64_t accounted_bytes_ = 0;
};

}  // namespace sapipe::addon
