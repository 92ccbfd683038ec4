// What the communicator bindings (LocalComm, UcxComm) share: buffer ranges taken from JS
// arguments and checked, and the queued operation that holds its buffers busy until it settles
// and turns a failed status (with details) into a JS error with a `code`.
#pragma once

#include <napi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../comm/collective.h"
#include "errors.h"
#include "js_args.h"
#include "native_buffer.h"
#include "queue.h"

namespace sapipe::addon {

using BufferPtr = std::shared_ptr<AlignedBuffer>;

[[noreturn]] inline void throw_detail(Napi::Env env, sapipe_status status, const std::string& op, const std::string& detail) {
  if (detail.empty()) throw_status(env, status, op);
  throw_error(env, sapipe_status_code(status), op + ": " + detail);
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
  r.offset = index_arg(info.Env(), info[i + 1], "offset");
  r.count = index_arg(info.Env(), info[i + 2], "count");
  if (r.offset > r.buffer->size() || r.count > r.buffer->size() - r.offset)
    throw_error(info.Env(), "ERR_SIZE_MISMATCH",
                std::string(what) + ": offset + count exceeds the buffer's " + std::to_string(r.buffer->size()) + " elements");
  return r;
}

// A group's size and a rank's place in it, checked: size in [1, 4096], rank in [0, size).
inline void check_rank(Napi::Env env, const char* what, size_t size, size_t rank) {
  if (size < 1 || size > 4096 || rank >= size)
    throw_error(env, "ERR_INVALID_ARGUMENT", std::string(what) + ": size must be in [1, 4096] and rank in [0, size)");
}

// A timeout in ms taken from JS, capped so that now + timeout cannot overflow.
inline std::chrono::milliseconds arg_timeout(const Napi::CallbackInfo& info, size_t i) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::min<size_t>(index_arg(info.Env(), info[i], "timeoutMs"), size_t{1} << 40)));
}

// The buffers and scale of collective(queue, kind, input, inOffset, inCount, output|null,
// outOffset, outCount, scale, ...), into args (whose kind is set), each buffer added to `held`.
// Kinds are numbered as native/comm/collective.h numbers them, for every backend.
inline void arg_collective(const Napi::CallbackInfo& info, comm::CollectiveArgs& args, std::vector<BufferPtr>& held) {
  using comm::CollectiveKind;
  Napi::Env env = info.Env();
  Range in, out;
  if (args.kind != CollectiveKind::kBarrier) {
    in = arg_range(info, 2, "input");
    held.push_back(in.buffer);
    args.input = in.data();
    args.input_count = in.count;
  }
  if (args.kind == CollectiveKind::kReduceScatter || args.kind == CollectiveKind::kAllgather) {
    out = arg_range(info, 5, "output");
    if (out.buffer == in.buffer)
      throw_error(env, "ERR_ALIASING", "collective: the output must be a different buffer from the input");
    held.push_back(out.buffer);
    args.output = out.data();
    args.output_count = out.count;
  }
  if (!info[8].IsNumber()) throw_error(env, "ERR_INVALID_ARGUMENT", "collective: scale must be a number");
  args.scale = info[8].As<Napi::Number>().FloatValue();
  if (!std::isfinite(args.scale)) throw_error(env, "ERR_INVALID_ARGUMENT", "collective: scale must be finite");
}

// Holds the buffers busy (dispose() refuses) from submission until the Promise settles.
class CommOp : public AsyncOp {
 public:
  CommOp(Napi::Env env, std::string name, std::vector<BufferPtr> held)
      : AsyncOp(env), name_(std::move(name)), held_(std::move(held)) {
    for (auto& b : held_) b->acquire();
  }
  ~CommOp() override { release(); }
  bool Failed() const override { return status_ != SAPIPE_OK; }
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
