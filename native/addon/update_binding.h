#pragma once
#include <napi.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "../core/aligned_buffer.h"
#include "errors.h"
#include "js_args.h"
#include "sapipe/kernels.h"
namespace sapipe::addon {
void InitUpdate(Napi::Env env, Napi::Object exports);
// The update configuration from its JS form (NativeUpdateConfig in lib/native.ts); the kernels
// check the values.
sapipe_update_config parse_update_config(const Napi::Object& config);

// A step's configuration and buffers from their JS forms (NativeUpdateConfig, NativeUpdateBuffers),
// with the buffers' memory held while the step is queued.
struct ParsedUpdate {
  sapipe_update_config config{};
  sapipe_update_buffers buffers{};
  // Written (and read) by the step.
  std::vector<std::shared_ptr<AlignedBuffer>> held;
  // Only read: an out-of-place step's input weights, which a forward pass may read meanwhile.
  std::shared_ptr<AlignedBuffer> read_only;
};
ParsedUpdate parse_update(Napi::Env env, const Napi::Value& config, const Napi::Value& buffers);

// The buffers of a step from their JS form (NativeUpdateBuffers), for host and device memory alike:
// `weights` (of `length` elements) already taken, every other buffer through `optional(key)`
// (null when absent; it checks and holds the memory), then the range. The one list of the buffers.
template <class Optional>
sapipe_update_buffers read_update_buffers(Napi::Env env, const Napi::Object& b, float* weights, size_t length, Optional optional) {
  sapipe_update_buffers u{};
  u.weights = weights;
  u.grad = optional("grad");
  if (u.grad == nullptr) throw_error(env, "ERR_INVALID_ARGUMENT", "buffers.grad is required");
  u.momentum = optional("momentum");
  u.second_moment = optional("secondMoment");
  u.backup = optional("backup");
  u.predicted = optional("predicted");
  u.local_grad = optional("localGrad");
  u.prev_local_grad = optional("prevLocalGrad");
  u.weights_in = optional("weightsIn");
  u.offset = get_index(b, "offset", 0);
  u.count = get_index(b, "count", length - std::min(length, u.offset));
  if (u.offset > length || u.count > length - u.offset)
    throw_error(env, "ERR_SIZE_MISMATCH", "buffers.offset + buffers.count exceeds the buffer length " + std::to_string(length));
  return u;
}

}  // namespace sapipe::addon
