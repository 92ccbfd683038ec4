#include "queue.h"

#include "addon_data.h"
#include "errors.h"

namespace sapipe::addon {

void Queue::Init(Napi::Env env, Napi::Object exports) {
  Napi::Function ctor = DefineClass(env, "Queue", {InstanceAccessor<&Queue::GetPending>("pending")});
  AddonData::Get(env).queue_ctor = Napi::Persistent(ctor);
  exports.Set("Queue", ctor);
}

Queue* Queue::FromValue(Napi::Env env, const Napi::Value& value) {
  if (!value.IsObject() || !value.As<Napi::Object>().InstanceOf(AddonData::Get(env).queue_ctor.Value()))
    throw_error(env, "ERR_INVALID_ARGUMENT", "queue must be a Queue");
  return Napi::ObjectWrap<Queue>::Unwrap(value.As<Napi::Object>());
}

Queue::Queue(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Queue>(info) {
  Napi::Env env = info.Env();
  exec_ = std::make_unique<ExecutionQueue>();
  using Flag = std::shared_ptr<std::atomic<bool>>;
  completions_ = Completions::New(
      env, "sapipe.Queue", 0, 1, this, [](Napi::Env, Flag* flag, Queue*) {
        (*flag)->store(true);
        delete flag;
      },
      new Flag(finalized_));
  // An idle queue must not keep the process alive; Submit refs it while work is pending.
  completions_.Unref(env);
}

Queue::~Queue() {
  exec_.reset();  // finishes queued work and joins the worker
  if (!finalized_->load()) completions_.Release();
}

Napi::Promise Queue::Submit(Napi::Env env, AsyncOp* op) {
  Napi::Promise promise = op->deferred().Promise();
  if (pending_++ == 0) {
    Ref();  // the wrapper must outlive its pending operations
    completions_.Ref(env);
  }
  Completions completions = completions_;
  exec_->submit([op, completions, finalized = finalized_]() mutable {
    op->Run();
    // Only while the environment shuts down: nobody is left to settle the Promise.
    if (finalized->load() || completions.NonBlockingCall(op) != napi_ok) delete op;
  });
  return promise;
}

void Queue::Settle(Napi::Env env, Napi::Function, Queue* queue, AsyncOp* op) {
  if (env == nullptr) {
    delete op;
    return;
  }
  // While a worker thread's environment is torn down (Worker.terminate()), JS can no longer run:
  // building the result or settling the Promise throws, and an exception leaving this callback
  // would abort the whole process. Nobody waits for the Promise then; the op is still released.
  try {
    Napi::HandleScope scope(env);
    try {
      Napi::Value value = op->Result(env);
      op->deferred().Resolve(value);
    } catch (const Napi::Error& error) {
      op->deferred().Reject(error.Value());
    }
  } catch (...) {
  }
  delete op;
  if (--queue->pending_ == 0) {
    try {
      queue->completions_.Unref(env);
      queue->Unref();
    } catch (...) {
    }
  }
}

Napi::Value Queue::GetPending(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), pending_);
}

}  // namespace sapipe::addon
