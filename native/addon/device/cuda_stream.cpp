#include "cuda_stream.h"

#include <string>
#include <utility>

#include "../addon_data.h"
#include "../errors.h"
#include "../js_args.h"
#include "cuda_binding.h"
#include "cuda_events.h"

namespace sapipe::addon {

void CudaStream::Init(Napi::Env env, Napi::Object exports) {
  Napi::Function ctor = DefineClass(env, "CudaStream",
                                    {InstanceAccessor<&CudaStream::GetDevice>("device"), InstanceMethod<&CudaStream::Run>("run"),
                                     InstanceMethod<&CudaStream::Synchronize>("synchronize"), InstanceMethod<&CudaStream::Query>("query"),
                                     InstanceMethod<&CudaStream::Record>("record"),
                                     InstanceMethod<&CudaStream::Wait>("wait"), InstanceMethod<&CudaStream::Dispose>("dispose")});
  AddonData::Get(env).cuda_stream_ctor = Napi::Persistent(ctor);
  exports.Set("CudaStream", ctor);
}

// new CudaStream(device): a stream of its own on cuda:device.
CudaStream::CudaStream(const Napi::CallbackInfo& info) : Napi::ObjectWrap<CudaStream>(info) {
  Napi::Env env = info.Env();
  device_ = static_cast<int32_t>(integer_arg(env, info[0], 0, 1023, "CudaStream(device)"));
  cuda_ = require_device_table(env, device_);
  void* s = nullptr;
  if (sapipe_status st = cuda_->stream_create(&s); st != SAPIPE_OK)
    throw_error(env, sapipe_status_code(st), std::string("CudaStream: cudaStreamCreate: ") + cuda_->last_error());
  const sapipe_cuda_plugin_v1* cuda = cuda_;
  const int32_t device = device_;
  // Best effort: nothing can be reported from a deleter, and a failure leaks one stream.
  stream_ = std::shared_ptr<void>(s, [cuda, device](void* p) {
    if (cuda->set_device(device) == SAPIPE_OK) cuda->stream_destroy(p);
  });
}

void* CudaStream::live(Napi::Env env, const char* what) {
  if (!stream_) throw_error(env, "ERR_DISPOSED", std::string("CudaStream.") + what + ": the stream was disposed");
  if (cuda_->set_device(device_) != SAPIPE_OK) throw_error(env, "ERR_BACKEND_UNAVAILABLE", device_unavailable(device_, cuda_));
  return stream_.get();
}

Napi::Value CudaStream::GetDevice(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), device_); }

// run(fn): fn() with this stream current on its device, then the previous current stream again
// (also when fn throws); returns fn's result. fn must not await: the slot is per thread, and
// another stage's code runs at an await.
Napi::Value CudaStream::Run(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  live(env, "run");
  if (!info[0].IsFunction()) throw_error(env, "ERR_INVALID_ARGUMENT", "CudaStream.run(fn): fn must be a function");
  auto& slots = AddonData::Get(env).current_streams;
  std::shared_ptr<void> previous;
  if (auto it = slots.find(device_); it != slots.end()) previous = it->second;
  slots[device_] = stream_;
  struct Restore {
    std::map<int32_t, std::shared_ptr<void>>& slots;
    int32_t device;
    std::shared_ptr<void> previous;
    ~Restore() {
      if (previous) slots[device] = std::move(previous);
      else slots.erase(device);
    }
  } restore{slots, device_, std::move(previous)};
  return info[0].As<Napi::Function>().Call({});
}

// synchronize(): waits until everything enqueued on the stream has run.
Napi::Value CudaStream::Synchronize(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  void* s = live(env, "synchronize");
  if (sapipe_status st = cuda_->stream_synchronize(s); st != SAPIPE_OK)
    throw_error(env, sapipe_status_code(st), std::string("CudaStream.synchronize: ") + cuda_->last_error());
  return env.Undefined();
}

// query(): whether everything enqueued on the stream has run; never blocks (a caller polls it
// between other work, with a deadline of its own). stream_query is among the appended entries
// require_device_table checks for.
Napi::Value CudaStream::Query(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  void* s = live(env, "query");
  int32_t done = 0;
  if (sapipe_status st = cuda_->stream_query(s, &done); st != SAPIPE_OK)
    throw_error(env, sapipe_status_code(st), std::string("CudaStream.query: ") + cuda_->last_error());
  return Napi::Boolean::New(env, done != 0);
}

namespace {

void* event_of(Napi::Env env, const Napi::CallbackInfo& info, int32_t device, const char* what) {
  std::shared_ptr<EventSet> set = CudaEvents::FromValue(env, info[0], what);
  if (set->device != device) throw_error(env, "ERR_INVALID_ARGUMENT", std::string(what) + ": the events are on another device than the stream");
  const auto i = static_cast<size_t>(integer_arg(env, info[1], 0, static_cast<double>(set->events.size()) - 1, what));
  return set->events[i];
}

}  // namespace

// record(events, i): records event i behind everything enqueued on this stream so far.
Napi::Value CudaStream::Record(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  void* s = live(env, "record");
  void* e = event_of(env, info, device_, "CudaStream.record(events, index)");
  if (sapipe_status st = cuda_->event_record(e, s); st != SAPIPE_OK)
    throw_error(env, sapipe_status_code(st), std::string("CudaStream.record: cudaEventRecord: ") + cuda_->last_error());
  return env.Undefined();
}

// wait(events, i): later work on this stream waits on the GPU for event i's last record.
Napi::Value CudaStream::Wait(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  void* s = live(env, "wait");
  void* e = event_of(env, info, device_, "CudaStream.wait(events, index)");
  if (sapipe_status st = cuda_->stream_wait_event(s, e); st != SAPIPE_OK)
    throw_error(env, sapipe_status_code(st), std::string("CudaStream.wait: cudaStreamWaitEvent: ") + cuda_->last_error());
  return env.Undefined();
}

// dispose(): drops this object's stream (destroyed once no run() holds it). Idempotent.
Napi::Value CudaStream::Dispose(const Napi::CallbackInfo& info) {
  stream_.reset();
  return info.Env().Undefined();
}

}  // namespace sapipe::addon
