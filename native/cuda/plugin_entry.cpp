// The CUDA plugin's C ABI (native/include/sapipe/plugin.h): argument checks, then the device
// functions and kernel launchers. Every entry is wrapped by guarded(): no exception leaves it.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "../core/update_plan.h"
#include "bench_update.cuh"
#include "device_errors.h"
#include "device_runtime.h"
#include "easgd.cuh"
#include "fused_update.cuh"
#include "nccl_entry.h"
#include "nn_ops.cuh"
#include "../core/device/nccl_loader.h"
#include "reduce.cuh"
#include "topk.cuh"
#include "sapipe/plugin.h"

#define SAPIPE_EXPORT extern "C" __attribute__((visibility("default")))

namespace sapipe::cuda {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

sapipe_status invalid(const char* what) { return fail(SAPIPE_ERR_INVALID_ARGUMENT, what); }

bool overlaps(const void* a, const void* b, size_t bytes) {
  auto x = static_cast<const char*>(a), y = static_cast<const char*>(b);
  return x < y + bytes && y < x + bytes;
}

sapipe_status checked_update(const sapipe_update_config* config, const sapipe_update_buffers* buffers) {
  if (config == nullptr || buffers == nullptr) return invalid("update: config and buffers are required");
  if (sapipe_status s = core::check_update_config(*config); s != SAPIPE_OK)
    return fail(s, "update: the configuration is out of range (see sapipe_update_config)");
  if (sapipe_status s = core::check_update_buffers(*config, *buffers); s != SAPIPE_OK)
    return fail(s, s == SAPIPE_ERR_ALIASING ? "update: two buffers overlap" : "update: a buffer the configuration needs is null");
  return SAPIPE_OK;
}

// The guard word of update() for the current device and thread.
sapipe_status guard_word(int64_t** out) {
  thread_local int device = -1;
  thread_local int64_t* word = nullptr;
  int current = 0;
  if (sapipe_status s = from_cuda(cudaGetDevice(&current), "cudaGetDevice"); s != SAPIPE_OK) return s;
  if (word == nullptr || device != current) {
    // A word of another device stays allocated there: rare, and freeing it would need a switch.
    if (sapipe_status s = from_cuda(cudaMalloc(reinterpret_cast<void**>(&word), sizeof(int64_t)), "cudaMalloc"); s != SAPIPE_OK)
      return s;
    device = current;
  }
  *out = word;
  return SAPIPE_OK;
}

const char* c_build_architectures() { return build_architectures(); }
// The runtime linked in (static): its headers' version when the call fails (CUDA 11.8's does
// where the driver sees no device).
int32_t c_runtime_version() {
  int v = 0;
  return cudaRuntimeGetVersion(&v) == cudaSuccess && v > 0 ? v : CUDART_VERSION;
}
const char* c_last_error() { return last_error_message(); }

sapipe_status c_device_count(int32_t* count) {
  return guarded("deviceCount", [&] { return device_count(count); });
}
sapipe_status c_device_info(int32_t device, sapipe_cuda_device_info* out) {
  return guarded("deviceInfo", [&] { return device_info(device, out); });
}
sapipe_status c_set_device(int32_t device) {
  return guarded("setDevice", [&] {
    int32_t n = 0;
    if (sapipe_status s = device_count(&n); s != SAPIPE_OK) return s;
    if (device < 0 || device >= n) return invalid("setDevice: no such device");
    return from_cuda(cudaSetDevice(device), "cudaSetDevice");
  });
}
sapipe_status c_malloc(void** ptr, size_t bytes) {
  return guarded("malloc", [&] {
    if (ptr == nullptr) return invalid("malloc: ptr is null");
    *ptr = nullptr;
    return from_cuda(cudaMalloc(ptr, bytes == 0 ? 1 : bytes), "cudaMalloc");
  });
}
sapipe_status c_free(void* ptr) {
  return guarded("free", [&] { return from_cuda(cudaFree(ptr), "cudaFree"); });
}
sapipe_status copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, void* stream, const char* what) {
  return guarded(what, [&] {
    if (dst == nullptr || src == nullptr) return invalid("copy: null pointer");
    if (overlaps(dst, src, bytes)) return fail(SAPIPE_ERR_ALIASING, "copy: source and destination overlap");
    return from_cuda(cudaMemcpyAsync(dst, src, bytes, kind, as_stream(stream)), what);
  });
}
sapipe_status c_copy_to_device(void* d, const void* s, size_t n, void* st) {
  return copy(d, s, n, cudaMemcpyHostToDevice, st, "copyToDevice");
}
sapipe_status c_copy_to_host(void* d, const void* s, size_t n, void* st) {
  return copy(d, s, n, cudaMemcpyDeviceToHost, st, "copyToHost");
}
sapipe_status c_copy_on_device(void* d, const void* s, size_t n, void* st) {
  return copy(d, s, n, cudaMemcpyDeviceToDevice, st, "copyOnDevice");
}
sapipe_status c_stream_create(void** stream) {
  return guarded("streamCreate", [&] {
    if (stream == nullptr) return invalid("streamCreate: null");
    return from_cuda(cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t*>(stream), cudaStreamNonBlocking),
                     "cudaStreamCreate");
  });
}
sapipe_status c_stream_destroy(void* stream) {
  return guarded("streamDestroy", [&] {
    if (stream == nullptr) return invalid("streamDestroy: the default stream cannot be destroyed");
    return from_cuda(cudaStreamDestroy(as_stream(stream)), "cudaStreamDestroy");
  });
}
sapipe_status c_stream_synchronize(void* stream) {
  return guarded("streamSynchronize", [&] { return from_cuda(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize"); });
}
sapipe_status c_event_create(void** event) {
  return guarded("eventCreate", [&] {
    if (event == nullptr) return invalid("eventCreate: null");
    return from_cuda(cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(event), cudaEventDisableTiming),
                     "cudaEventCreate");
  });
}
sapipe_status c_event_destroy(void* event) {
  return guarded("eventDestroy", [&] {
    if (event == nullptr) return invalid("eventDestroy: null");
    return from_cuda(cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy");
  });
}
sapipe_status c_event_record(void* event, void* stream) {
  return guarded("eventRecord", [&] {
    if (event == nullptr) return invalid("eventRecord: null event");
    return from_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event), as_stream(stream)), "cudaEventRecord");
  });
}
sapipe_status c_stream_wait_event(void* stream, void* event) {
  return guarded("streamWaitEvent", [&] {
    if (event == nullptr) return invalid("streamWaitEvent: null event");
    return from_cuda(cudaStreamWaitEvent(as_stream(stream), static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
  });
}

sapipe_status c_update_async(const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                             uint16_t* predicted_bf16, int64_t* guard_count, void* stream) {
  return guarded("update", [&] {
    if (sapipe_status s = checked_update(config, buffers); s != SAPIPE_OK) return s;
    if (!config->grad_checked && guard_count == nullptr) return invalid("update: guard_count is required unless grad_checked");
    return enqueue_fused_update(*config, *buffers, predicted_bf16, guard_count, as_stream(stream));
  });
}

sapipe_status c_update(const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                       uint16_t* predicted_bf16, sapipe_update_result* result, void* stream) {
  return guarded("update", [&] {
    if (result == nullptr) return invalid("update: result is null");
    result->applied = 0;
    result->non_finite_count = 0;
    if (sapipe_status s = checked_update(config, buffers); s != SAPIPE_OK) return s;
    int64_t* word = nullptr;
    if (sapipe_status s = guard_word(&word); s != SAPIPE_OK) return s;
    cudaStream_t st = as_stream(stream);
    if (sapipe_status s = enqueue_fused_update(*config, *buffers, predicted_bf16, config->grad_checked ? nullptr : word, st);
        s != SAPIPE_OK)
      return s;
    int64_t bad = 0;
    if (!config->grad_checked)
      if (sapipe_status s = from_cuda(cudaMemcpyAsync(&bad, word, sizeof bad, cudaMemcpyDeviceToHost, st), "update: read guard");
          s != SAPIPE_OK)
        return s;
    if (sapipe_status s = from_cuda(cudaStreamSynchronize(st), "update: synchronize"); s != SAPIPE_OK) return s;
    result->non_finite_count = bad;
    result->applied = bad == 0 ? 1 : 0;
    return SAPIPE_OK;
  });
}

sapipe_status c_elastic_average(float* worker, float* center, size_t count, float alpha, void* stream) {
  return guarded("elasticAverage", [&] {
    if (worker == nullptr || center == nullptr) return invalid("elasticAverage: null buffer");
    if (!std::isfinite(alpha) || alpha < 0.0f || alpha > 1.0f) return invalid("elasticAverage: alpha must be in [0, 1]");
    if (overlaps(worker, center, count * sizeof(float))) return fail(SAPIPE_ERR_ALIASING, "elasticAverage: buffers overlap");
    return enqueue_elastic_average(worker, center, count, alpha, as_stream(stream));
  });
}
sapipe_status c_sum(float* out, const float* const* inputs, size_t k, size_t count, float scale, int64_t* non_finite,
                    void* stream) {
  return guarded("sum", [&] {
    if (out == nullptr || inputs == nullptr || k == 0 || !std::isfinite(scale)) return invalid("sum: bad arguments");
    for (size_t i = 0; i < k; ++i) {
      if (inputs[i] == nullptr) return invalid("sum: null input");
      // Later inputs are read after out is written: only inputs[0] may be out.
      if (i > 0 && inputs[i] == out) return fail(SAPIPE_ERR_ALIASING, "sum: only the first input may be the output");
    }
    return enqueue_sum(out, inputs, k, count, scale, non_finite, as_stream(stream));
  });
}
sapipe_status c_scale(float* x, size_t count, float s, void* stream) {
  return guarded("scale", [&] {
    if (x == nullptr || !std::isfinite(s)) return invalid("scale: bad arguments");
    return enqueue_scale(x, count, s, as_stream(stream));
  });
}
sapipe_status c_axpy(float* y, const float* x, size_t count, float a, void* stream) {
  return guarded("axpy", [&] {
    if (y == nullptr || x == nullptr || !std::isfinite(a)) return invalid("axpy: bad arguments");
    return enqueue_axpy(y, x, count, a, as_stream(stream));
  });
}
sapipe_status c_squared_norm(const float* x, size_t count, double* out, void* stream) {
  return guarded("squaredNorm", [&] {
    if (x == nullptr || out == nullptr) return invalid("squaredNorm: null pointer");
    return enqueue_squared_norm(x, count, out, as_stream(stream));
  });
}
sapipe_status c_count_non_finite(const float* x, size_t count, int64_t* out, void* stream) {
  return guarded("countNonFinite", [&] {
    if (x == nullptr || out == nullptr) return invalid("countNonFinite: null pointer");
    return enqueue_count_non_finite_into(x, count, out, as_stream(stream));
  });
}
sapipe_status c_topk_select(const float* grad, float* residual, size_t count, size_t k, int32_t rounds, int32_t* out_indices,
                            float* out_values, sapipe_topk_stats* stats, void* stream) {
  return guarded("topkSelect", [&] {
    if (grad == nullptr || rounds < 0 || (k > 0 && (out_indices == nullptr || out_values == nullptr)))
      return invalid("topkSelect: grad (and, for k > 0, out_indices and out_values) are required and rounds must be >= 0");
    if (count > static_cast<size_t>(INT32_MAX) || k > count) return invalid("topkSelect: count must fit an int32 and k <= count");
    if (residual != nullptr && overlaps(grad, residual, count * sizeof(float))) return fail(SAPIPE_ERR_ALIASING, "topkSelect: grad and residual overlap");
    return topk_select(grad, residual, count, k, rounds, out_indices, out_values, stats, as_stream(stream));
  });
}
sapipe_status c_scatter_add(float* out, size_t count, const int32_t* indices, const float* values, size_t n, float scale,
                            int64_t* device_bad, void* stream) {
  return guarded("scatterAdd", [&] {
    if (out == nullptr || (n > 0 && (indices == nullptr || values == nullptr)) || !std::isfinite(scale))
      return invalid("scatterAdd: out (and, for n > 0, indices and values) are required and scale must be finite");
    return enqueue_scatter_add(out, count, indices, values, n, scale, device_bad, as_stream(stream));
  });
}
sapipe_status c_zero(float* x, size_t count, void* stream) {
  return guarded("zero", [&] {
    if (x == nullptr) return invalid("zero: null pointer");
    return from_cuda(cudaMemsetAsync(x, 0, count * sizeof(float), as_stream(stream)), "zero");
  });
}
sapipe_status c_nccl_probe(int32_t* version, const char** library_path) {
  return guarded("ncclProbe", [&] {
    const nccl::Api* api = nullptr;
    std::string reason;
    if (sapipe_status s = nccl::load(std::getenv("SAPIPE_NCCL_PATH"), &api, &reason); s != SAPIPE_OK) return fail(s, reason);
    if (version) *version = api->version;
    if (library_path) *library_path = api->path.c_str();
    return SAPIPE_OK;
  });
}
sapipe_status c_bench_update(const sapipe_update_config* config, size_t count, int32_t reps, int32_t warmup,
                             sapipe_cuda_bench_result* out) {
  return guarded("benchUpdate", [&] {
    if (config == nullptr || out == nullptr) return invalid("benchUpdate: null argument");
    if (sapipe_status s = core::check_update_config(*config); s != SAPIPE_OK)
      return fail(s, "benchUpdate: the configuration is out of range");
    int32_t n = 0;
    if (sapipe_status s = device_count(&n); s != SAPIPE_OK) return s;
    return bench_update(*config, count, reps, warmup, out);
  });
}

const sapipe_cuda_plugin_v1 kTable = {
    {SAPIPE_CUDA_PLUGIN_ABI_VERSION, sizeof(sapipe_cuda_plugin_v1), "cuda"},
    c_build_architectures,
    c_runtime_version,
    c_last_error,
    c_device_count,
    c_device_info,
    c_set_device,
    c_malloc,
    c_free,
    c_copy_to_device,
    c_copy_to_host,
    c_copy_on_device,
    c_stream_create,
    c_stream_destroy,
    c_stream_synchronize,
    c_event_create,
    c_event_destroy,
    c_event_record,
    c_stream_wait_event,
    c_update_async,
    c_update,
    c_elastic_average,
    c_sum,
    c_scale,
    c_axpy,
    c_squared_norm,
    c_count_non_finite,
    c_nccl_probe,
    c_bench_update,
    c_stream_query,
    c_nccl_get_unique_id,
    c_nccl_comm_init_rank,
    c_nccl_comm_destroy,
    c_nccl_comm_abort,
    c_nccl_comm_async_error,
    c_nccl_all_reduce,
    c_nccl_reduce_scatter,
    c_nccl_all_gather,
    c_nccl_broadcast,
    c_nccl_send,
    c_nccl_recv,
    c_nccl_fused_update,
    c_nccl_fused_update_recheck,
    c_nccl_fused_update_result,
    c_topk_select,
    c_scatter_add,
    c_zero,
    cuda_nn_ops,
    cublas_probe,
    c_nccl_fused_update_after,
};

}  // namespace
}  // namespace sapipe::cuda

SAPIPE_EXPORT const sapipe_plugin_header* sapipe_plugin_entry(uint32_t abi_version) {
  if (abi_version != SAPIPE_CUDA_PLUGIN_ABI_VERSION) return nullptr;
  return &sapipe::cuda::kTable.header;
}
