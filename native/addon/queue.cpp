#include "queue.h"

#include <mutex>
#include <system_error>
#include <utility>

#include "addon_data.h"
#include "errors.h"

namespace sapipe::addon {

struct Queue::State {
  using Completions = Napi::TypedThreadSafeFunction<State, AsyncOp, &Queue::Settle>;

  std::mutex mutex;
  Completions completions;
  // Cleared (under the mutex) by the environment's cleanup hook, by the thread-safe function's
  // finalizer and by ~Queue: from then on the thread-safe function is never called again. In
  // Node.js 20 the environment deletes a thread-safe function at teardown whatever threads still
  // hold it, so an unlocked check followed by a call is a use-after-free.
  bool open = true;
  bool finalized = false;  // the thread-safe function is gone: never release it
  Queue* queue = nullptr;  // read on the JS thread only; null once the wrapper is destroyed

  // On the worker thread: hands op to the JS thread. False when nobody will settle it any more.
  bool Post(AsyncOp* op) {
    std::lock_guard<std::mutex> lock(mutex);
    return open && completions.NonBlockingCall(op) == napi_ok;
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mutex);
    open = false;
  }
};

void Queue::Init(Napi::Env env, Napi::Object exports) {
  Napi::Function ctor = DefineClass(env, "Queue", {InstanceAccessor<&Queue::GetPending>("pending"), InstanceMethod<&Queue::Close>("close")});
  AddonData::Get(env).queue_ctor = Napi::Persistent(ctor);
  exports.Set("Queue", ctor);
}

Queue* Queue::FromValue(Napi::Env env, const Napi::Value& value) {
  if (!value.IsObject() || !value.As<Napi::Object>().InstanceOf(AddonData::Get(env).queue_ctor.Value()))
    throw_error(env, "ERR_INVALID_ARGUMENT", "queue must be a Queue");
  return Napi::ObjectWrap<Queue>::Unwrap(value.As<Napi::Object>());
}

// Resolves close()'s Promise; settling it on the JS thread is where the ended worker is joined.
class Queue::CloseOp : public AsyncOp {
 public:
  CloseOp(Napi::Env env, Queue* queue) : AsyncOp(env), queue_(queue) {}
  void Run() override {}
  Napi::Value Result(Napi::Env env) override {
    // The worker's last act was to hand this op over, so the join returns at once.
    if (queue_->exec_) {
      queue_->exec_->join();
      queue_->exec_.reset();
    }
    return env.Undefined();
  }

 private:
  Queue* queue_;  // alive: a pending operation holds a reference to the wrapper
};

Queue::Queue(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Queue>(info) {
  Napi::Env env = info.Env();
  // The thread first: when a thread or pids limit refuses it, nothing else needs undoing.
  try {
    exec_ = std::make_unique<ExecutionQueue>();
  } catch (const std::system_error& error) {
    throw_error(env, "ERR_RESOURCE_LIMIT",
                std::string("cannot start an execution queue's thread (") + error.what() +
                    "): the process reached its limit on threads (ulimit -u, a container's pids limit); "
                    "destroy the communicators and queues no longer used, or raise the limit");
  }
  state_ = std::make_shared<State>();
  state_->queue = this;
  using Holder = std::shared_ptr<State>;
  // The thread-safe function keeps State alive until its finalizer; it calls Settle with a null
  // env for completions still queued after that, and Settle then leaves State alone.
  state_->completions = State::Completions::New(
      env, "sapipe.Queue", 0, 1, state_.get(),
      [](Napi::Env, Holder* holder, State*) {
        {
          std::lock_guard<std::mutex> lock((*holder)->mutex);
          (*holder)->open = false;
          (*holder)->finalized = true;
        }
        delete holder;
      },
      new Holder(state_));
  // An idle queue must not keep the process alive; Submit refs it while work is pending.
  state_->completions.Unref(env);
  env_ = env;
  hook_registered_ = napi_add_env_cleanup_hook(env, &Queue::OnEnvCleanup, this) == napi_ok;
}

// The environment is being torn down (a terminated worker, or its thread's exit): JS will not run
// again, so nothing may be settled; the wrapper itself is destroyed later, when the environment
// finalizes what it still holds.
void Queue::OnEnvCleanup(void* arg) {
  auto* queue = static_cast<Queue*>(arg);
  queue->hook_registered_ = false;
  queue->Shutdown();
}

void Queue::Shutdown() {
  state_->Close();
  if (exec_) exec_->shutdown();  // the operations not started are destroyed here, unsettled
}

Queue::~Queue() {
  if (hook_registered_) {
    napi_remove_env_cleanup_hook(env_, &Queue::OnEnvCleanup, this);
    hook_registered_ = false;
  }
  // Collected with nothing pending (Submit holds a reference), or finalized at teardown after
  // the cleanup hook: either way no completion is wanted any more.
  Shutdown();
  exec_.reset();  // joins the worker once the operation in progress, if any, has finished
  state_->queue = nullptr;
  bool release;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    release = !state_->finalized;
  }
  if (release) state_->completions.Release();
}

Napi::Promise Queue::Submit(Napi::Env env, AsyncOp* op) {
  if (closing_ || !exec_) {
    delete op;
    throw_error(env, "ERR_DISPOSED", "the execution queue was closed (its communicator or owner was destroyed)");
  }
  // Owned by the task until handed to the JS thread: a task dropped at teardown (or after
  // Post fails) destroys its operation, on whichever thread drops it.
  auto slot = std::make_shared<std::unique_ptr<AsyncOp>>(op);
  Napi::Promise promise = op->deferred().Promise();
  if (pending_++ == 0) {
    Ref();  // the wrapper must outlive its pending operations
    state_->completions.Ref(env);
  }
  exec_->submit([slot, state = state_](bool previous_failed) {
    (*slot)->previous_failed_ = previous_failed;
    (*slot)->Run();
    const bool failed = (*slot)->Failed();
    AsyncOp* raw = slot->release();
    if (!state->Post(raw)) slot->reset(raw);
    return failed;
  });
  return promise;
}

void Queue::Settle(Napi::Env env, Napi::Function, State* state, AsyncOp* op) {
  std::unique_ptr<AsyncOp> owned(op);
  // Null env: the thread-safe function is being deleted (after its finalizer); `state` may be
  // gone already. The operation is only destroyed.
  if (env == nullptr) return;
  // While a worker thread's environment is torn down (Worker.terminate()), JS can no longer run:
  // building the result or settling the Promise throws, and an exception leaving this callback
  // would abort the whole process. Nobody waits for the Promise then; the op is still released.
  try {
    Napi::HandleScope scope(env);
    try {
      Napi::Value value = owned->Result(env);
      owned->deferred().Resolve(value);
    } catch (const Napi::Error& error) {
      owned->deferred().Reject(error.Value());
    }
  } catch (...) {
  }
  owned.reset();
  Queue* queue = state->queue;
  if (queue != nullptr && --queue->pending_ == 0) {
    try {
      state->completions.Unref(env);
      queue->Unref();
    } catch (...) {
    }
  }
}

Napi::Value Queue::Close(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto* op = new CloseOp(env, this);
  Napi::Promise promise = op->deferred().Promise();
  if (!exec_) {  // closed and joined already
    op->deferred().Resolve(env.Undefined());
    delete op;
    return promise;
  }
  closing_ = true;
  if (pending_++ == 0) {
    Ref();
    state_->completions.Ref(env);
  }
  auto slot = std::make_shared<std::unique_ptr<AsyncOp>>(op);
  exec_->close([slot, state = state_] {
    AsyncOp* raw = slot->release();
    if (!state->Post(raw)) slot->reset(raw);
  });
  return promise;
}

Napi::Value Queue::GetPending(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), pending_);
}

}  // namespace sapipe::addon
