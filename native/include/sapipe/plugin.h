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

#define SAPIPE_CUDA_PLUGIN_ABI_VERSION 1u

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
} sapipe_cuda_plugin_v1;

#ifdef __cplusplus
}
#endif

#endif
