// A complete CUDA plugin table for a machine with a driver but no device: every device function
// answers SAPIPE_ERR_BACKEND_UNAVAILABLE, as the real plugin does when cudaGetDeviceCount finds
// none. Lets the addon's "no device" path be tested without a GPU.
// Built again with SAPIPE_FAKE_DEVICE_WITHOUT_CODE: one visible device (a V100, sm 7.0) that this
// "CUDA 13" plugin has no code for, as the real CUDA 13 plugin sees a V100; the loader must pass it
// over for another candidate (sapipe_cuda11.so).
#include <cstring>

#include "sapipe/plugin.h"

namespace {

const char* kReason = "no CUDA device is visible (libcuda.so.1 loaded; check CUDA_VISIBLE_DEVICES and nvidia-smi)";

template <class R, class... A>
struct Unavailable;
template <class... A>
struct Unavailable<sapipe_status, A...> {
  static sapipe_status fn(A...) { return SAPIPE_ERR_BACKEND_UNAVAILABLE; }
};

template <class F>
struct UnavailableEntry;
template <class R, class... A>
struct UnavailableEntry<R (*)(A...)> {
  static constexpr R (*value)(A...) = Unavailable<R, A...>::fn;
};

// The entry of that name, answering SAPIPE_ERR_BACKEND_UNAVAILABLE.
#define UNAVAILABLE(member) UnavailableEntry<decltype(sapipe_cuda_plugin_v1::member)>::value

sapipe_cuda_plugin_v1 make_table() {
  sapipe_cuda_plugin_v1 t;
  std::memset(&t, 0, sizeof t);
  t.header = {SAPIPE_CUDA_PLUGIN_ABI_VERSION, sizeof(sapipe_cuda_plugin_v1), "cuda"};
  t.build_architectures = [] { return "sm_80 compute_80"; };
  t.runtime_version = []() -> int32_t { return 13000; };
  t.last_error = [] { return kReason; };
#ifdef SAPIPE_FAKE_DEVICE_WITHOUT_CODE
  t.build_architectures = [] { return "sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_110 sm_120 compute_120"; };
  t.device_count = [](int32_t* n) {
    if (n == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
    *n = 1;
    return SAPIPE_OK;
  };
  t.device_info = [](int32_t device, sapipe_cuda_device_info* out) {
    if (device != 0 || out == nullptr) return SAPIPE_ERR_INVALID_ARGUMENT;
    std::memset(out, 0, sizeof *out);
    std::strcpy(out->name, "Tesla V100-SXM2-32GB (fake)");
    out->major = 7, out->minor = 0, out->multiprocessors = 80, out->total_memory = uint64_t{32} << 30;
    out->kernels_available = 0;
    return SAPIPE_OK;
  };
#else
  t.device_count = [](int32_t* n) {
    if (n) *n = 0;
    return SAPIPE_ERR_BACKEND_UNAVAILABLE;
  };
  t.device_info = UNAVAILABLE(device_info);
#endif
  t.set_device = UNAVAILABLE(set_device);
  t.malloc_device = UNAVAILABLE(malloc_device);
  t.free_device = UNAVAILABLE(free_device);
  t.copy_to_device = UNAVAILABLE(copy_to_device);
  t.copy_to_host = UNAVAILABLE(copy_to_host);
  t.copy_on_device = UNAVAILABLE(copy_on_device);
  t.stream_create = UNAVAILABLE(stream_create);
  t.stream_destroy = UNAVAILABLE(stream_destroy);
  t.stream_synchronize = UNAVAILABLE(stream_synchronize);
  t.event_create = UNAVAILABLE(event_create);
  t.event_destroy = UNAVAILABLE(event_destroy);
  t.event_record = UNAVAILABLE(event_record);
  t.stream_wait_event = UNAVAILABLE(stream_wait_event);
  t.update_async = UNAVAILABLE(update_async);
  t.update = UNAVAILABLE(update);
  t.elastic_average = UNAVAILABLE(elastic_average);
  t.sum = UNAVAILABLE(sum);
  t.scale = UNAVAILABLE(scale);
  t.axpy = UNAVAILABLE(axpy);
  t.squared_norm = UNAVAILABLE(squared_norm);
  t.count_non_finite = UNAVAILABLE(count_non_finite);
  t.nccl_probe = UNAVAILABLE(nccl_probe);
  t.bench_update = UNAVAILABLE(bench_update);
#ifdef SAPIPE_FAKE_BASE_TABLE
  // As a plugin built before the entries appended to v1: the loader accepts it, device buffers
  // and NCCL communicators must report that it predates them.
  t.header.table_size = SAPIPE_CUDA_PLUGIN_V1_BASE_SIZE;
#else
  t.stream_query = UNAVAILABLE(stream_query);
  t.nccl_get_unique_id = UNAVAILABLE(nccl_get_unique_id);
  t.nccl_comm_init_rank = UNAVAILABLE(nccl_comm_init_rank);
  t.nccl_comm_destroy = UNAVAILABLE(nccl_comm_destroy);
  t.nccl_comm_abort = UNAVAILABLE(nccl_comm_abort);
  t.nccl_comm_async_error = UNAVAILABLE(nccl_comm_async_error);
  t.nccl_all_reduce = UNAVAILABLE(nccl_all_reduce);
  t.nccl_reduce_scatter = UNAVAILABLE(nccl_reduce_scatter);
  t.nccl_all_gather = UNAVAILABLE(nccl_all_gather);
  t.nccl_broadcast = UNAVAILABLE(nccl_broadcast);
  t.nccl_send = UNAVAILABLE(nccl_send);
  t.nccl_recv = UNAVAILABLE(nccl_recv);
  t.nccl_fused_update = UNAVAILABLE(nccl_fused_update);
  t.nccl_fused_update_recheck = UNAVAILABLE(nccl_fused_update_recheck);
  t.nccl_fused_update_result = UNAVAILABLE(nccl_fused_update_result);
  t.topk_select = UNAVAILABLE(topk_select);
  t.scatter_add = UNAVAILABLE(scatter_add);
  t.zero = UNAVAILABLE(zero);
  t.nn_ops = [] {
    static const sapipe_nn_ops ops = {
        sizeof(sapipe_nn_ops),
        UnavailableEntry<decltype(sapipe_nn_ops::gemm)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::bias_add)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::bias_grad)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::relu)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::relu_backward)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::softmax_xent)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::gelu)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::gelu_backward)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::add)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::layer_norm)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::layer_norm_backward)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::embedding)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::embedding_backward)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::dropout)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::attention)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::attention_backward)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::conv2d)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::conv2d_backward)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::pool2d)>::value,
        UnavailableEntry<decltype(sapipe_nn_ops::pool2d_backward)>::value,
    };
    return &ops;
  };
  t.cublas_probe = UNAVAILABLE(cublas_probe);
  t.nccl_fused_update_after = UNAVAILABLE(nccl_fused_update_after);
#endif
  return t;
}

const sapipe_cuda_plugin_v1 kTable = make_table();

}  // namespace

extern "C" __attribute__((visibility("default"))) const sapipe_plugin_header* sapipe_plugin_entry(uint32_t abi) {
  return abi == SAPIPE_CUDA_PLUGIN_ABI_VERSION ? &kTable.header : nullptr;
}
