// The NCCL part of the CUDA plugin's C ABI (the entries appended to sapipe_cuda_plugin_v1):
// communicators, collectives on device buffers and the fused steps. Each entry checks its
// arguments and runs under guarded(): no exception leaves it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sapipe/plugin.h"

namespace sapipe::cuda {

sapipe_status c_stream_query(void* stream, int32_t* done);
sapipe_status c_nccl_get_unique_id(uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES]);
sapipe_status c_nccl_comm_init_rank(void** comm, int32_t size, const uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES], int32_t rank);
sapipe_status c_nccl_comm_destroy(void* comm);
sapipe_status c_nccl_comm_abort(void* comm);
sapipe_status c_nccl_comm_async_error(void* comm, int32_t* nccl_result);
sapipe_status c_nccl_all_reduce(void* comm, const float* send, float* recv, size_t count, int32_t op, void* stream);
sapipe_status c_nccl_reduce_scatter(void* comm, const float* send, float* recv, size_t recv_count, int32_t op, void* stream);
sapipe_status c_nccl_all_gather(void* comm, const float* send, float* recv, size_t send_count, void* stream);
sapipe_status c_nccl_broadcast(void* comm, const float* send, float* recv, size_t count, int32_t root, void* stream);
sapipe_status c_nccl_send(void* comm, const float* buffer, size_t count, int32_t peer, void* stream);
sapipe_status c_nccl_recv(void* comm, float* buffer, size_t count, int32_t peer, void* stream);
sapipe_status c_nccl_fused_update(void* comm, const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                                  const size_t* bucket_counts, size_t num_buckets, int32_t sharded, void* comm_stream,
                                  void* compute_stream);
sapipe_status c_nccl_fused_update_after(void* comm, const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                                        const size_t* bucket_counts, void* const* ready, size_t num_buckets, void* comm_stream,
                                        void* compute_stream);
sapipe_status c_nccl_fused_update_recheck(void* comm, const sapipe_update_config* config,
                                          const sapipe_update_buffers* buffers, int32_t sharded, void* comm_stream,
                                          void* compute_stream);
sapipe_status c_nccl_fused_update_result(void* comm, sapipe_nccl_step_result* out);

}  // namespace sapipe::cuda
