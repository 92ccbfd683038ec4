// Queue: the JS face of an ExecutionQueue. Each submitted AsyncOp runs on the queue's native
// worker thread, in submission order, and settles its Promise on the JS thread.
//
// Teardown (a worker thread terminated, or its environment exiting, with work in flight): the
// environment's cleanup hook closes the completion channel and drops the operations not started
// yet; the one in progress finishes on the worker thread and is destroyed there, unsettled
// (nobody can await it any more). Nothing on the worker thread touches a JS value, the Queue
// wrapper or a thread-safe function that may already be gone: it reaches the JS thread only
// through State, which is shared (std::shared_ptr) and checked under a mutex.
#pragma once

#include <napi.h>

#include <memory>

#include "../core/execution_queue.h"

namespace sapipe::addon {

class AsyncOp {
 public:
  explicit AsyncOp(Napi::Env env) : deferred_(Napi::Promise::Deferred::New(env)) {}
  // May run on the queue's worker thread or while the environment is torn down: it must not
  // touch JS values (the Deferred holds no reference that needs releasing).
  virtual ~AsyncOp() = default;
  virtual void Run() = 0;                         // on the queue's worker thread
  virtual Napi::Value Result(Napi::Env env) = 0;  // on the JS thread; may throw Napi::Error
  // Whether Run() ended in failure (its Promise will reject), read on the worker thread right
  // after Run(): the ExecutionQueue tells the next operation (previous_failed()).
  virtual bool Failed() const { return false; }
  Napi::Promise::Deferred& deferred() { return deferred_; }

 protected:
  // In Run(): whether the operation run just before this one on the same queue failed, so an
  // operation queued behind another can act on its outcome (a latch signal behind a reduction).
  bool previous_failed() const { return previous_failed_; }

 private:
  friend class Queue;
  Napi::Promise::Deferred deferred_;
  bool previous_failed_ = false;
};

class Queue : public Napi::ObjectWrap<Queue> {
 public:
  static void Init(Napi::Env env, Napi::Object exports);
  static Queue* FromValue(Napi::Env env, const Napi::Value& value);
  explicit Queue(const Napi::CallbackInfo& info);
  ~Queue() override;

  // Takes ownership of op and returns its Promise. Throws ERR_DISPOSED after close().
  Napi::Promise Submit(Napi::Env env, AsyncOp* op);

 private:
  // The completion channel: the thread-safe function and whether it may still be called. Owned
  // jointly by the wrapper, every queued task and the thread-safe function (whose context it is).
  struct State;

  static void Settle(Napi::Env env, Napi::Function, State* state, AsyncOp* op);
  static void OnEnvCleanup(void* arg);
  void Shutdown();  // on the JS thread: no more completions; drops the work not started

  Napi::Value GetPending(const Napi::CallbackInfo& info);
  // close(): takes no more operations, lets those submitted run (so every Promise settles), then
  // ends the worker thread. Resolves once the thread has been joined, on the JS thread.
  Napi::Value Close(const Napi::CallbackInfo& info);
  class CloseOp;

  std::shared_ptr<State> state_;
  std::unique_ptr<ExecutionQueue> exec_;
  int pending_ = 0;  // touched on the JS thread only
  bool closing_ = false;  // on the JS thread only: close() was called
  napi_env env_ = nullptr;
  bool hook_registered_ = false;
};

}  // namespace sapipe::addon
