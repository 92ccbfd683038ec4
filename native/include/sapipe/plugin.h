/* C ABI between the addon and the plugins it opens with dlopen (DESIGN.md: the addon never links
 * CUDA, NCCL or UCX). A plugin exports one symbol, sapipe_plugin_entry, that returns a function
 * table for the ABI version the caller asks for, or NULL when it cannot serve that version. Every
 * table starts with sapipe_plugin_header, so a loader can check what it got before using more.
 *
 * Rules for every function in a table: no C++ exception crosses it, every pointer argument is
 * checked, and a failure returns a sapipe_status whose details last_error() describes (per thread).
 * Device pointers are CUDA device (or managed) addresses; streams and events are cudaStream_t and
 * cudaEvent_t passed as void*, NULL meaning the legacy default stream. */
#ifndef SAPIPE_PLUGIN_H
#define SAPIPE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "sapipe/kernels.h"
#include "sapipe/nn.h"
#include "sapipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SAPIPE_PLUGIN_ENTRY_SYMBOL "sapipe_plugin_entry"

typedef struct sapipe_plugin_header {
  uint32_t abi_version; /* the table layout this plugin returned */
  uint32_t table_size;  /* sizeof the whole table; a loader needs at least the size it knows */
  const char* name;     /* "cuda", "ucx", ... */
} sapipe_plugin_header;

typedef const sapipe_plugin_header* (*sapipe_plugin_entry_fn)(uint32_t abi_version);

/* ---- CUDA ---------------------------------------------------------------------------------- */

#define SAPIPE_CUDA_PLUGIN_ABI_VERSION 2u

typedef struct sapipe_cuda_device_info {
  char name[256];
  int32_t major, minor;          /* compute capability */
  int32_t multiprocessors;
  uint64_t total_memory;         /* bytes */
  int32_t kernels_available;     /* 1 when the plugin holds machine code or PTX this device can run */
} sapipe_cuda_device_info;

/* Timings of one fused update variant (sapipe bench kernels --device cuda:N), each the median of
 * reps runs after warmup, measured with CUDA events; the device-to-device copy reference is
 * interleaved with the variant's runs so both see the same clocks. */
typedef struct sapipe_cuda_bench_result {
  double update_ms;         /* fused kernel alone (grad_checked) */
  double guarded_ms;        /* guard scan, then the fused kernel */
  double copy_ms;           /* cudaMemcpyAsync device to device of count floats */
  int32_t bytes_per_element;
} sapipe_cuda_bench_result;

#define SAPIPE_NCCL_UNIQUE_ID_BYTES 128
#define SAPIPE_NCCL_SUM 0
#define SAPIPE_NCCL_AVG 1

/* What a fused NCCL step did (nccl_fused_update_result). */
typedef struct sapipe_nccl_step_result {
  int32_t applied;          /* 1 when every rank updated */
  int32_t overflow_risk;    /* 1 when skipped only because a sum could overflow: run the recheck */
  int64_t non_finite_count; /* non-finite inputs over all ranks (or, after a recheck, reduced values) */
} sapipe_nccl_step_result;

typedef struct sapipe_cuda_plugin_v1 {
  sapipe_plugin_header header;

  /* What was compiled in: e.g. "sm_75 sm_80 ... compute_120", and the CUDA runtime version. */
  const char* (*build_architectures)(void);
  int32_t (*runtime_version)(void);
  /* Details of the last failure on this thread ("" when none). Never NULL. */
  const char* (*last_error)(void);

  /* Devices. SAPIPE_ERR_BACKEND_UNAVAILABLE when the driver (libcuda.so.1) is missing or too old
   * or no device is visible, with the reason in last_error(). */
  sapipe_status (*device_count)(int32_t* count);
  sapipe_status (*device_info)(int32_t device, sapipe_cuda_device_info* out);
  sapipe_status (*set_device)(int32_t device);

  /* Memory, streams and events. */
  sapipe_status (*malloc_device)(void** ptr, size_t bytes);
  sapipe_status (*free_device)(void* ptr);
  sapipe_status (*copy_to_device)(void* dst, const void* src, size_t bytes, void* stream);
  sapipe_status (*copy_to_host)(void* dst, const void* src, size_t bytes, void* stream);
  sapipe_status (*copy_on_device)(void* dst, const void* src, size_t bytes, void* stream);
  sapipe_status (*stream_create)(void** stream);
  sapipe_status (*stream_destroy)(void* stream);
  sapipe_status (*stream_synchronize)(void* stream);
  sapipe_status (*event_create)(void** event);
  sapipe_status (*event_destroy)(void* event);
  sapipe_status (*event_record)(void* event, void* stream);
  sapipe_status (*stream_wait_event)(void* stream, void* event);

  /* The fused update on device buffers, enqueued on stream. Checks as sapipe_cpu_update does.
   * guard_count: device memory for one int64, the non-finite count of this step (the guard kernel
   * writes it, the update kernel reads it and returns early when non-zero: all or nothing with no
   * host round trip). predicted_bf16: optional bf16 copy of w_hat (same offset and count). */
  sapipe_status (*update_async)(const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                                uint16_t* predicted_bf16, int64_t* guard_count, void* stream);
  /* update_async on an internal guard word, then waits for the stream and fills result. */
  sapipe_status (*update)(const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                          uint16_t* predicted_bf16, sapipe_update_result* result, void* stream);

  /* The helpers, as their sapipe_cpu_* namesakes, enqueued on stream. Results that are numbers
   * (non-finite counts, squared norm) are written to device memory (int64 / double). */
  sapipe_status (*elastic_average)(float* worker, float* center, size_t count, float alpha, void* stream);
  sapipe_status (*sum)(float* out, const float* const* inputs, size_t num_inputs, size_t count, float scale,
                       int64_t* device_non_finite, void* stream);
  sapipe_status (*scale)(float* x, size_t count, float scale, void* stream);
  sapipe_status (*axpy)(float* y, const float* x, size_t count, float a, void* stream);
  sapipe_status (*squared_norm)(const float* x, size_t count, double* device_out, void* stream);
  sapipe_status (*count_non_finite)(const float* x, size_t count, int64_t* device_out, void* stream);

  /* Opens NCCL (libnccl.so.2; the folders or files in SAPIPE_NCCL_PATH first, then the system's
   * library path) unless already open. SAPIPE_ERR_BACKEND_UNAVAILABLE with every place looked at
   * in last_error() when it cannot. version: NCCL's code (e.g. 22703); library_path: the file. */
  sapipe_status (*nccl_probe)(int32_t* version, const char** library_path);

  /* Allocates its own buffers of count elements on the current device, fills them with distinct
   * values, and times one update variant against a device-to-device copy. */
  sapipe_status (*bench_update)(const sapipe_update_config* config, size_t count, int32_t reps, int32_t warmup,
                                sapipe_cuda_bench_result* out);

  /* ---- Appended to v1 (device buffers and NCCL communicators). A plugin built before these
   * returns a smaller table_size: the loader accepts any table of at least
   * SAPIPE_CUDA_PLUGIN_V1_BASE_SIZE bytes, and a caller checks table_size >= sizeof(the table)
   * before using the entries below. ------------------------------------------------------------ */

  /* *done = 1 when every operation enqueued on stream has finished, else 0; never blocks. Lets a
   * caller wait with a deadline, polling nccl_comm_async_error (a blocking synchronize would hang
   * for ever when a peer of a collective dies). */
  sapipe_status (*stream_query)(void* stream, int32_t* done);

  /* NCCL communicators. comm is an opaque handle made by nccl_comm_init_rank, owning the
   * ncclComm_t and the scratch words and events of the fused steps. NCCL is opened as nccl_probe
   * opens it; a missing NCCL is SAPIPE_ERR_BACKEND_UNAVAILABLE with the places looked at. */
  sapipe_status (*nccl_get_unique_id)(uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES]);
  /* Joins the clique on the calling thread's current device (set_device first); blocks until
   * every rank of it has called. */
  sapipe_status (*nccl_comm_init_rank)(void** comm, int32_t size, const uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES],
                                       int32_t rank);
  /* Destroy waits for the comm's pending work; abort does not (use it once a peer is lost). Both
   * free the handle. */
  sapipe_status (*nccl_comm_destroy)(void* comm);
  sapipe_status (*nccl_comm_abort)(void* comm);
  /* *nccl_result = ncclCommGetAsyncError's code (0: healthy; 7: still in progress). */
  sapipe_status (*nccl_comm_async_error)(void* comm, int32_t* nccl_result);

  /* fp32 collectives on device buffers, enqueued on stream. op: SAPIPE_NCCL_SUM or SAPIPE_NCCL_AVG.
   * In place where NCCL allows it (reduce_scatter: recv == send + rank * recv_count; all_gather:
   * send == recv + rank * send_count). */
  sapipe_status (*nccl_all_reduce)(void* comm, const float* send, float* recv, size_t count, int32_t op, void* stream);
  sapipe_status (*nccl_reduce_scatter)(void* comm, const float* send, float* recv, size_t recv_count, int32_t op,
                                       void* stream);
  sapipe_status (*nccl_all_gather)(void* comm, const float* send, float* recv, size_t send_count, void* stream);
  sapipe_status (*nccl_broadcast)(void* comm, const float* send, float* recv, size_t count, int32_t root, void* stream);
  sapipe_status (*nccl_send)(void* comm, const float* buffer, size_t count, int32_t peer, void* stream);
  sapipe_status (*nccl_recv)(void* comm, float* buffer, size_t count, int32_t peer, void* stream);

  /* The fused all-reduce + update of one parameter set (native/cuda/bucket_update.h), enqueued.
   * buffers: the whole set ([offset, offset + count) of every buffer); config.grad_scale should fold
   * in 1/size. The guard (all or nothing on every rank): each rank's non-finite count and whether
   * its gradients could overflow a sum of size of them (|g| > FLT_MAX / 2 size, from the squared
   * norm) are all-reduced before any bucket; the update is skipped everywhere when either is
   * non-zero. Then, replicated (sharded = 0): bucket i ([offset + sum of earlier counts,
   * + bucket_counts[i]), the counts summing to count) is all-reduced in place on comm_stream, and
   * its update runs on compute_stream after that bucket's event. Sharded (sharded = 1; count must
   * be a multiple of size): a reduce-scatter in place, the update of this rank's part
   * [offset + rank * count / size, + count / size) only, then all-gathers in place of the weights
   * and (when present) the predicted weights, so every rank ends with every part (ZeRO-1; the
   * optimizer state is current on the own part only). bucket_counts is ignored when sharded. */
  sapipe_status (*nccl_fused_update)(void* comm, const sapipe_update_config* config,
                                     const sapipe_update_buffers* buffers, const size_t* bucket_counts,
                                     size_t num_buckets, int32_t sharded, void* comm_stream, void* compute_stream);
  /* After a fused update skipped for an overflow risk only (no non-finite input): the gradients are
   * already reduced (the own part when sharded), so count the non-finite elements of the reduced
   * gradient, all-reduce that count, and update (and all-gather, when sharded) unless it is non-zero.
   * Exact and all or nothing, without a second reduction. */
  sapipe_status (*nccl_fused_update_recheck)(void* comm, const sapipe_update_config* config,
                                             const sapipe_update_buffers* buffers, int32_t sharded, void* comm_stream,
                                             void* compute_stream);
  /* The outcome of the last fused update or recheck, once both of its streams are idle. */
  sapipe_status (*nccl_fused_update_result)(void* comm, sapipe_nccl_step_result* out);

  /* MSTopK on device buffers, as sapipe_cpu_topk_select (the same threshold search, from counts
   * taken on the device): grad, residual (or NULL), out_indices and out_values (k entries) are
   * device memory, stats host memory (or NULL); grad must be finite (count_non_finite first).
   * The search decides on the host, so this waits for `stream` once per sampling pass and returns
   * once the selection is written. */
  sapipe_status (*topk_select)(const float* grad, float* residual, size_t count, size_t k, int32_t rounds,
                               int32_t* out_indices, float* out_values, sapipe_topk_stats* stats, void* stream);
  /* out[indices[i]] += scale * values[i] for i < n, enqueued on stream. The indices of one call
   * must be distinct (a selection's are), so the result does not depend on thread order; calls on
   * one stream apply in order (one per rank's pairs: the same sum on every rank). Indices outside
   * [0, count) are skipped and counted into *device_bad (an int64 in device memory, not cleared;
   * may be NULL). */
  sapipe_status (*scatter_add)(float* out, size_t count, const int32_t* indices, const float* values, size_t n, float scale,
                               int64_t* device_bad, void* stream);
  /* x[0, count) = +0.0f, enqueued (a memset: NaN/Inf are cleared too, which scale(x, 0) would keep). */
  sapipe_status (*zero)(float* x, size_t count, void* stream);
  /* The model operations on device memory (sapipe/nn.h), enqueued on the given stream. Matrix
   * products go through cuBLAS, opened at run time like NCCL (SAPIPE_CUBLAS_PATH, then
   * libcublas.so.13, .12, .11 on the system's library path): its gemm returns
   * SAPIPE_ERR_BACKEND_UNAVAILABLE, with the places looked at in last_error(), when it cannot. */
  const sapipe_nn_ops* (*nn_ops)(void);
  /* Opens cuBLAS as nn_ops' gemm does, unless already open. version: cublasGetVersion's (e.g.
   * 130100); library_path: the file. */
  sapipe_status (*cublas_probe)(int32_t* version, const char** library_path);

  /* nccl_fused_update (replicated) over a gradient that a backward pass is still writing on
   * other streams: ready[i] is an event recorded once bucket i's gradient was enqueued, and
   * bucket i's all-reduce waits for it on comm_stream (cudaStreamWaitEvent), so no host wait for
   * the whole backward is needed. The buckets are reduced from the last to the first, the order
   * a backward pass writes them in (the last layer's parameters lie at the end of the set). The
   * guard's counts are taken bucket by bucket before each reduction and all-reduced after the
   * last one, so every update runs once every bucket is reduced (all or nothing needs every
   * count). The sums and updates are those of nccl_fused_update; only the squared norm that
   * decides an overflow risk is summed in another order. An event that was never recorded would
   * make its wait a no-op: the caller records every bucket's event before this call. */
  sapipe_status (*nccl_fused_update_after)(void* comm, const sapipe_update_config* config,
                                           const sapipe_update_buffers* buffers, const size_t* bucket_counts,
                                           void* const* ready, size_t num_buckets, void* comm_stream,
                                           void* compute_stream);
} sapipe_cuda_plugin_v1;

/* Bytes of the table as it was before the appended entries: what every v1 plugin provides. */
#define SAPIPE_CUDA_PLUGIN_V1_BASE_SIZE offsetof(sapipe_cuda_plugin_v1, stream_query)

#ifdef __cplusplus
}
#endif

#endif
