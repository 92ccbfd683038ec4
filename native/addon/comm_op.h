// What the communicator bindings (LocalComm, UcxComm) share: buffer ranges taken from JS
// arguments and checked, and the queued operation that holds its buffers busy until it settles
// and turns a failed status (with details) into a JS error with a `code`.
#pragma once

#include <napi.h>

#include <memory>
#include <string>
#include <vector>

#include "errors.h"
#include "native_buffer.h"
#include "queue.h"

namespace sapipe::addon {

using BufferPtr = std::shared_ptr<AlignedBuffer>;

[[noreturn]] inline void throw_detail(Napi::Env env, sapipe_status status, const std::string& op, const std::string& detail) {
  if (detail.empty()) throw_status(env, status, op);
  throw_error(env, sapipe_status_code(status), op + ": " + detail);
}

inline size_t arg_index(const Napi::CallbackInfo& info, size_t i, const char* what) {
  const Napi::Value v = info[i];
  if (!v.IsNumber()) throw_error(info.Env(), "ERR_INVALID_ARGUMENT", std::string(what) + " must be a number");
  double d = v.As<Napi::Number>().DoubleValue();
  if (!(d >= 0) || d > 9007199254740991.0 || static_cast<double>(static_cast<size_t>(d)) != d)
    throw_error(info.Env(), "ERR_INVALID_ARGUMENT", std::string(what) + " must be a non-negative integer");
  return static_cast<size_t>(d);
}

// A buffer range [offset, offset + count) taken from JS arguments, checked against the length.
struct Range {
  BufferPtr buffer;
  size_t offset = 0;
  size_t count = 0;
  float* data() const { return buffer ? buffer->data() + offset : nullptr; }
};

inline Range arg_range(const Napi::CallbackInfo& info, size_t i, const char* what) {
  Range r;
  r.buffer = NativeBuffer::FromValue(info.Env(), info[i], what);
  r.offset = arg_index(info, i + 1, "offset");
  r.count = arg_index(info, i + 2, "count");
  if (r.offset > r.buffer->size() || r.count > r.buffer->size() - r.offset)
    throw_error(info.Env(), "ERR_SIZE_MISMATCH",
                std::string(what) + ": offset + count exceeds the buffer's " + std::to_string(r.buffer->size()) + " elements");
  return r;
}

// Holds the buffers busy (dispose() refuses) from submission until the Promise settles.
class CommOp : public AsyncOp {
 public:
  CommOp(Napi::Env env, std::string name, std::vector<BufferPtr> held)
      : AsyncOp(env), name_(std::move(name)), held_(std::move(held)) {
    for (auto& b : held_) b->acquire();
  }
  ~CommOp() override { release(); }
  Napi::Value Result(Napi::Env env) override {
    release();
    if (status_ != SAPIPE_OK) throw Napi::Error(env, make_error(env));
    return Value(env);
  }

 protected:
  virtual Napi::Value Value(Napi::Env env) { return env.Undefined(); }
  sapipe_status status_ = SAPIPE_ERR_INTERNAL;
  std::string detail_;

 private:
  Napi::Value make_error(Napi::Env env) {
    Napi::Error e = detail_.empty() ? make_status_error(env, status_, name_)
                                    : Napi::Error::New(env, name_ + ": " + detail_);
    e.Set("code", Napi::String::New(env, sapipe_status_code(status_)));
    return e.Value();
  }
  void release() {
    for (auto& b : held_) b->release();
    held_.clear();
  }
  std::string name_;
  std::vector<BufferPtr> held_;
};

}  // namespace sapipe::addon
