#include "cuda_events.h"

#include <string>

#include "../addon_data.h"
#include "../errors.h"
#include "../js_args.h"
#include "cuda_binding.h"

namespace sapipe::addon {

EventSet::~EventSet() {
  // Best effort: nothing can be reported from a destructor, and a failure leaks one event.
  if (cuda == nullptr) return;
  cuda->set_device(device);
  for (void* e : events) cuda->event_destroy(e);
}

void CudaEvents::Init(Napi::Env env, Napi::Object exports) {
  Napi::Function ctor = DefineClass(env, "CudaEvents",
                                    {InstanceAccessor<&CudaEvents::GetCount>("count"),
                                     InstanceMethod<&CudaEvents::Record>("record"),
                                     InstanceMethod<&CudaEvents::Dispose>("dispose")});
  AddonData::Get(env).cuda_events_ctor = Napi::Persistent(ctor);
  exports.Set("CudaEvents", ctor);
}

std::shared_ptr<EventSet> CudaEvents::FromValue(Napi::Env env, const Napi::Value& value, const char* what) {
  if (!value.IsObject() || !value.As<Napi::Object>().InstanceOf(AddonData::Get(env).cuda_events_ctor.Value()))
    throw_error(env, "ERR_INVALID_ARGUMENT", std::string(what) + " must be a CudaEvents");
  CudaEvents* self = Napi::ObjectWrap<CudaEvents>::Unwrap(value.As<Napi::Object>());
  if (!self->set_) throw_error(env, "ERR_DISPOSED", std::string(what) + " was disposed");
  return self->set_;
}

// new CudaEvents(device, count): count events on cuda:device, created without timing.
CudaEvents::CudaEvents(const Napi::CallbackInfo& info) : Napi::ObjectWrap<CudaEvents>(info) {
  Napi::Env env = info.Env();
  const auto device = static_cast<int32_t>(integer_arg(env, info[0], 0, 1023, "CudaEvents(device)"));
  count_ = static_cast<uint32_t>(integer_arg(env, info[1], 1, 16777216, "CudaEvents(count)"));
  auto set = std::make_shared<EventSet>();
  set->cuda = require_device_table(env, device);
  set->device = device;
  set->events.reserve(count_);
  for (uint32_t i = 0; i < count_; ++i) {
    void* e = nullptr;
    if (sapipe_status s = set->cuda->event_create(&e); s != SAPIPE_OK)
      throw_error(env, sapipe_status_code(s), std::string("CudaEvents: cudaEventCreate: ") + set->cuda->last_error());
    set->events.push_back(e);
  }
  set_ = std::move(set);
}

Napi::Value CudaEvents::GetCount(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), count_); }

// record(i): records event i on the device's legacy default stream, behind everything enqueued
// there so far (the model operations).
Napi::Value CudaEvents::Record(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!set_) throw_error(env, "ERR_DISPOSED", "CudaEvents.record: the events were disposed");
  const auto i = static_cast<size_t>(integer_arg(env, info[0], 0, static_cast<double>(count_) - 1, "CudaEvents.record(index)"));
  const sapipe_cuda_plugin_v1* cuda = set_->cuda;
  if (cuda->set_device(set_->device) != SAPIPE_OK) throw_error(env, "ERR_BACKEND_UNAVAILABLE", device_unavailable(set_->device, cuda));
  if (sapipe_status s = cuda->event_record(set_->events[i], nullptr); s != SAPIPE_OK)
    throw_error(env, sapipe_status_code(s), std::string("CudaEvents.record: cudaEventRecord: ") + cuda->last_error());
  return env.Undefined();
}

// dispose(): drops this object's hold; a queued step that waits on the events keeps them until it
// settles. Idempotent.
Napi::Value CudaEvents::Dispose(const Napi::CallbackInfo& info) {
  set_.reset();
  return info.Env().Undefined();
}

}  // namespace sapipe::addon
