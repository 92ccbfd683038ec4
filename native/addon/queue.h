// Queue: the JS face of an ExecutionQueue. Each submitted AsyncOp runs on the queue's native
// worker thread, in submission order, and settles its Promise on the JS thread.
#pragma once

#include <napi.h>

#include <atomic>
#include <memory>

#include "../core/execution_queue.h"

namespace sapipe::addon {

class AsyncOp {
 public:
  explicit AsyncOp(Napi::Env env) : deferred_(Napi::Promise::Deferred::New(env)) {}
  virtual ~AsyncOp() = default;
  virtual void Run() = 0;                         // on the queue's worker thread
  virtual Napi::Value Result(Napi::Env env) = 0;  // on the JS thread; may throw Napi::Error
  Napi::Promise::Deferred& deferred() { return deferred_; }

 private:
  Napi::Promise::Deferred deferred_;
};

class Queue : public Napi::ObjectWrap<Queue> {
 public:
  static void Init(Napi::Env env, Napi::Object exports);
  static Queue* FromValue(Napi::Env env, const Napi::Value& value);
  explicit Queue(const Napi::CallbackInfo& info);
  ~Queue() override;

  // Takes ownership of op and returns its Promise.
  Napi::Promise Submit(Napi::Env env, AsyncOp* op);

 private:
  static void Settle(Napi::Env env, Napi::Function, Queue* queue, AsyncOp* op);
  using Completions = Napi::TypedThreadSafeFunction<Queue, AsyncOp, &Queue::Settle>;

  Napi::Value GetPending(const Napi::CallbackInfo& info);

  std::unique_ptr<ExecutionQueue> exec_;
  Completions completions_;
  int pending_ = 0;  // touched on the JS thread only
  // Set when the environment tears the thread-safe function down (a terminated worker) before
  // this wrapper is collected: it must then be neither called nor released again.
  std::shared_ptr<std::atomic<bool>> finalized_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace sapipe::addon
