#include "nccl_entry.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../core/update_plan.h"
#include "bucket_update.h"
#include "device_errors.h"
#include "../core/device/nccl_loader.h"

namespace sapipe::cuda {
namespace {

// What a comm handle of the ABI points to: the NCCL communicator plus what the fused steps need
// on its device (their scratch words and events), created once and reused every step.
struct NcclCommunicator {
  const nccl::Api* api = nullptr;
  nccl::Comm comm = nullptr;
  int device = 0;
  int rank = 0;
  int size = 0;
  void* scratch = nullptr;
  std::vector<cudaEvent_t> reduced;
  cudaEvent_t updated = nullptr;
  bool last_was_recheck = false;

  ~NcclCommunicator() {
    // Best effort: the handle is going away whatever these return.
    for (cudaEvent_t e : reduced) cudaEventDestroy(e);
    if (updated != nullptr) cudaEventDestroy(updated);
    if (scratch != nullptr) cudaFree(scratch);
  }
};

sapipe_status invalid(const std::string& what) { return fail(SAPIPE_ERR_INVALID_ARGUMENT, what); }

sapipe_status from_nccl(const nccl::Api& api, nccl::Result r, const char* what) {
  if (r == nccl::kSuccess || r == nccl::kInProgress) return SAPIPE_OK;
  const std::string text = std::string(what) + ": " + (api.GetErrorString ? api.GetErrorString(r) : "NCCL error") +
                           " (ncclResult " + std::to_string(r) + ")";
  // ncclSystemError (2) and ncclRemoteError (6) are what a lost peer looks like from here.
  return fail(r == 2 || r == 6 ? SAPIPE_ERR_PEER_LOST : SAPIPE_ERR_INTERNAL, text);
}

sapipe_status load_nccl(const nccl::Api** api) {
  std::string reason;
  if (sapipe_status s = nccl::load(std::getenv("SAPIPE_NCCL_PATH"), api, &reason); s != SAPIPE_OK) return fail(s, reason);
  return SAPIPE_OK;
}

// The communicator behind a handle, with its device made current on this thread (every entry
// may be called from any thread: the addon's worker threads included).
sapipe_status use(void* handle, NcclCommunicator** out, const char* what) {
  if (handle == nullptr) return invalid(std::string(what) + ": the communicator is null");
  auto* c = static_cast<NcclCommunicator*>(handle);
  if (c->comm == nullptr) return fail(SAPIPE_ERR_PEER_LOST, std::string(what) + ": the communicator was aborted");
  if (sapipe_status s = from_cuda(cudaSetDevice(c->device), "cudaSetDevice"); s != SAPIPE_OK) return s;
  *out = c;
  return SAPIPE_OK;
}

nccl::RedOp red_op(int32_t op) { return op == SAPIPE_NCCL_AVG ? nccl::kAvg : nccl::kSum; }
bool valid_op(int32_t op) { return op == SAPIPE_NCCL_SUM || op == SAPIPE_NCCL_AVG; }

sapipe_status checked_update(const sapipe_update_config* config, const sapipe_update_buffers* buffers, const char* what) {
  if (config == nullptr || buffers == nullptr) return invalid(std::string(what) + ": config and buffers are required");
  if (sapipe_status s = core::check_update_config(*config); s != SAPIPE_OK)
    return fail(s, std::string(what) + ": the configuration is out of range (see sapipe_update_config)");
  if (sapipe_status s = core::check_update_buffers(*config, *buffers); s != SAPIPE_OK)
    return fail(s, std::string(what) + (s == SAPIPE_ERR_ALIASING ? ": two buffers overlap" : ": a buffer the configuration needs is null"));
  return SAPIPE_OK;
}

// The checks of both fused entries; then the communicator, with its device current.
sapipe_status prepare_fused(void* comm, const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                            void* comm_stream, void* compute_stream, const char* what, NcclCommunicator** out) {
  if (sapipe_status s = checked_update(config, buffers, what); s != SAPIPE_OK) return s;
  // The overlap needs two streams; the legacy stream would serialise them.
  if (comm_stream == nullptr || compute_stream == nullptr || comm_stream == compute_stream)
    return invalid(std::string(what) + ": two distinct created streams are needed (communication, compute)");
  return use(comm, out, what);
}

sapipe_status ensure_events(NcclCommunicator& c, size_t count) {
  while (c.reduced.size() < count) {
    cudaEvent_t e = nullptr;
    if (sapipe_status s = from_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"); s != SAPIPE_OK)
      return s;
    c.reduced.push_back(e);
  }
  return SAPIPE_OK;
}

FusedStepRun run_of(NcclCommunicator& c, void* comm_stream, void* compute_stream) {
  return {c.api,
          c.comm,
          c.rank,
          c.size,
          static_cast<cudaStream_t>(comm_stream),
          static_cast<cudaStream_t>(compute_stream),
          c.reduced.data(),
          c.updated,
          c.scratch};
}

}  // namespace

sapipe_status c_stream_query(void* stream, int32_t* done) {
  return guarded("streamQuery", [&] {
    if (done == nullptr) return invalid("streamQuery: done is null");
    const cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(stream));
    *done = e == cudaSuccess ? 1 : 0;
    return e == cudaErrorNotReady ? SAPIPE_OK : from_cuda(e, "cudaStreamQuery");
  });
}

sapipe_status c_nccl_get_unique_id(uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES]) {
  return guarded("ncclGetUniqueId", [&] {
    if (id == nullptr) return invalid("ncclGetUniqueId: id is null");
    const nccl::Api* api = nullptr;
    if (sapipe_status s = load_nccl(&api); s != SAPIPE_OK) return s;
    nccl::UniqueId u{};
    static_assert(sizeof u.internal == SAPIPE_NCCL_UNIQUE_ID_BYTES, "NCCL_UNIQUE_ID_BYTES");
    if (sapipe_status s = from_nccl(*api, api->GetUniqueId(&u), "ncclGetUniqueId"); s != SAPIPE_OK) return s;
    std::memcpy(id, u.internal, sizeof u.internal);
    return SAPIPE_OK;
  });
}

sapipe_status c_nccl_comm_init_rank(void** comm, int32_t size, const uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES], int32_t rank) {
  return guarded("ncclCommInitRank", [&] {
    if (comm == nullptr || id == nullptr) return invalid("ncclCommInitRank: null argument");
    *comm = nullptr;
    if (size < 1 || rank < 0 || rank >= size) return invalid("ncclCommInitRank: rank must be in [0, size)");
    auto c = std::make_unique<NcclCommunicator>();
    if (sapipe_status s = load_nccl(&c->api); s != SAPIPE_OK) return s;
    if (sapipe_status s = from_cuda(cudaGetDevice(&c->device), "cudaGetDevice"); s != SAPIPE_OK) return s;
    c->rank = rank, c->size = size;
    if (sapipe_status s = from_cuda(cudaMalloc(&c->scratch, kFusedStepScratchBytes), "cudaMalloc (scratch)"); s != SAPIPE_OK)
      return s;
    if (sapipe_status s = from_cuda(cudaEventCreateWithFlags(&c->updated, cudaEventDisableTiming), "cudaEventCreate");
        s != SAPIPE_OK)
      return s;
    if (sapipe_status s = ensure_events(*c, 1); s != SAPIPE_OK) return s;
    nccl::UniqueId u{};
    std::memcpy(u.internal, id, sizeof u.internal);
    if (sapipe_status s = from_nccl(*c->api, c->api->CommInitRank(&c->comm, size, u, rank), "ncclCommInitRank"); s != SAPIPE_OK) {
      c->comm = nullptr;
      return s;
    }
    *comm = c.release();
    return SAPIPE_OK;
  });
}

// Ends a communicator with `end` (ncclCommDestroy, or ncclCommAbort, which does not wait for
// outstanding work) on its device, and frees it.
template <class End>
sapipe_status end_comm(void* comm, const char* what, End end) {
  return guarded(what, [&] {
    if (comm == nullptr) return invalid(std::string(what) + ": the communicator is null");
    std::unique_ptr<NcclCommunicator> c(static_cast<NcclCommunicator*>(comm));
    if (c->comm == nullptr) return SAPIPE_OK;
    cudaSetDevice(c->device);
    return from_nccl(*c->api, end(*c->api, c->comm), what);
  });
}

sapipe_status c_nccl_comm_destroy(void* comm) {
  return end_comm(comm, "ncclCommDestroy", [](const auto& api, auto c) { return api.CommDestroy(c); });
}

sapipe_status c_nccl_comm_abort(void* comm) {
  return end_comm(comm, "ncclCommAbort", [](const auto& api, auto c) { return api.CommAbort(c); });
}

sapipe_status c_nccl_comm_async_error(void* comm, int32_t* nccl_result) {
  return guarded("ncclCommGetAsyncError", [&] {
    NcclCommunicator* c = nullptr;
    if (nccl_result == nullptr) return invalid("ncclCommGetAsyncError: result is null");
    if (sapipe_status s = use(comm, &c, "ncclCommGetAsyncError"); s != SAPIPE_OK) return s;
    nccl::Result r = nccl::kSuccess;
    if (sapipe_status s = from_nccl(*c->api, c->api->CommGetAsyncError(c->comm, &r), "ncclCommGetAsyncError"); s != SAPIPE_OK)
      return s;
    *nccl_result = r;
    return SAPIPE_OK;
  });
}

sapipe_status c_nccl_all_reduce(void* comm, const float* send, float* recv, size_t count, int32_t op, void* stream) {
  return guarded("ncclAllReduce", [&] {
    NcclCommunicator* c = nullptr;
    if (send == nullptr || recv == nullptr || !valid_op(op)) return invalid("ncclAllReduce: null buffer or unknown op");
    if (sapipe_status s = use(comm, &c, "ncclAllReduce"); s != SAPIPE_OK) return s;
    return from_nccl(*c->api, c->api->AllReduce(send, recv, count, nccl::kFloat32, red_op(op), c->comm, stream), "ncclAllReduce");
  });
}

sapipe_status c_nccl_reduce_scatter(void* comm, const float* send, float* recv, size_t recv_count, int32_t op, void* stream) {
  return guarded("ncclReduceScatter", [&] {
    NcclCommunicator* c = nullptr;
    if (send == nullptr || recv == nullptr || !valid_op(op)) return invalid("ncclReduceScatter: null buffer or unknown op");
    if (sapipe_status s = use(comm, &c, "ncclReduceScatter"); s != SAPIPE_OK) return s;
    return from_nccl(*c->api, c->api->ReduceScatter(send, recv, recv_count, nccl::kFloat32, red_op(op), c->comm, stream),
                     "ncclReduceScatter");
  });
}

sapipe_status c_nccl_all_gather(void* comm, const float* send, float* recv, size_t send_count, void* stream) {
  return guarded("ncclAllGather", [&] {
    NcclCommunicator* c = nullptr;
    if (send == nullptr || recv == nullptr) return invalid("ncclAllGather: null buffer");
    if (sapipe_status s = use(comm, &c, "ncclAllGather"); s != SAPIPE_OK) return s;
    return from_nccl(*c->api, c->api->AllGather(send, recv, send_count, nccl::kFloat32, c->comm, stream), "ncclAllGather");
  });
}

sapipe_status c_nccl_broadcast(void* comm, const float* send, float* recv, size_t count, int32_t root, void* stream) {
  return guarded("ncclBroadcast", [&] {
    NcclCommunicator* c = nullptr;
    if (send == nullptr || recv == nullptr) return invalid("ncclBroadcast: null buffer");
    if (sapipe_status s = use(comm, &c, "ncclBroadcast"); s != SAPIPE_OK) return s;
    if (root < 0 || root >= c->size) return invalid("ncclBroadcast: root must be a rank");
    return from_nccl(*c->api, c->api->Broadcast(send, recv, count, nccl::kFloat32, root, c->comm, stream), "ncclBroadcast");
  });
}

sapipe_status c_nccl_send(void* comm, const float* buffer, size_t count, int32_t peer, void* stream) {
  return guarded("ncclSend", [&] {
    NcclCommunicator* c = nullptr;
    if (buffer == nullptr) return invalid("ncclSend: null buffer");
    if (sapipe_status s = use(comm, &c, "ncclSend"); s != SAPIPE_OK) return s;
    if (peer < 0 || peer >= c->size || peer == c->rank) return invalid("ncclSend: peer must be another rank");
    return from_nccl(*c->api, c->api->Send(buffer, count, nccl::kFloat32, peer, c->comm, stream), "ncclSend");
  });
}

sapipe_status c_nccl_recv(void* comm, float* buffer, size_t count, int32_t peer, void* stream) {
  return guarded("ncclRecv", [&] {
    NcclCommunicator* c = nullptr;
    if (buffer == nullptr) return invalid("ncclRecv: null buffer");
    if (sapipe_status s = use(comm, &c, "ncclRecv"); s != SAPIPE_OK) return s;
    if (peer < 0 || peer >= c->size || peer == c->rank) return invalid("ncclRecv: peer must be another rank");
    return from_nccl(*c->api, c->api->Recv(buffer, count, nccl::kFloat32, peer, c->comm, stream), "ncclRecv");
  });
}

sapipe_status c_nccl_fused_update(void* comm, const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                                  const size_t* bucket_counts, size_t num_buckets, int32_t sharded, void* comm_stream,
                                  void* compute_stream) {
  return guarded("ncclFusedUpdate", [&] {
    NcclCommunicator* c = nullptr;
    if (sapipe_status s = prepare_fused(comm, config, buffers, comm_stream, compute_stream, "ncclFusedUpdate", &c); s != SAPIPE_OK)
      return s;
    c->last_was_recheck = false;
    if (sharded) return enqueue_sharded_update(run_of(*c, comm_stream, compute_stream), *config, *buffers);
    if (bucket_counts == nullptr || num_buckets == 0) return invalid("ncclFusedUpdate: at least one bucket is needed");
    size_t total = 0;
    for (size_t i = 0; i < num_buckets; ++i) {
      if (bucket_counts[i] == 0) return invalid("ncclFusedUpdate: an empty bucket");
      total += bucket_counts[i];
    }
    if (total != buffers->count)
      return fail(SAPIPE_ERR_SIZE_MISMATCH, "ncclFusedUpdate: the bucket counts must sum to buffers.count");
    if (sapipe_status s = ensure_events(*c, num_buckets); s != SAPIPE_OK) return s;
    return enqueue_bucketed_update(run_of(*c, comm_stream, compute_stream), *config, *buffers, bucket_counts, num_buckets);
  });
}

sapipe_status c_nccl_fused_update_after(void* comm, const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                                        const size_t* bucket_counts, void* const* ready, size_t num_buckets, void* comm_stream,
                                        void* compute_stream) {
  return guarded("ncclFusedUpdateAfter", [&] {
    NcclCommunicator* c = nullptr;
    if (sapipe_status s = prepare_fused(comm, config, buffers, comm_stream, compute_stream, "ncclFusedUpdateAfter", &c);
        s != SAPIPE_OK)
      return s;
    if (bucket_counts == nullptr || ready == nullptr || num_buckets == 0)
      return invalid("ncclFusedUpdateAfter: at least one bucket, and an event for each, are needed");
    size_t total = 0;
    std::vector<cudaEvent_t> events(num_buckets);
    for (size_t i = 0; i < num_buckets; ++i) {
      if (bucket_counts[i] == 0) return invalid("ncclFusedUpdateAfter: an empty bucket");
      if (ready[i] == nullptr) return invalid("ncclFusedUpdateAfter: bucket " + std::to_string(i) + " has no event");
      total += bucket_counts[i];
      events[i] = static_cast<cudaEvent_t>(ready[i]);
    }
    if (total != buffers->count)
      return fail(SAPIPE_ERR_SIZE_MISMATCH, "ncclFusedUpdateAfter: the bucket counts must sum to buffers.count");
    c->last_was_recheck = false;
    return enqueue_bucketed_update_after(run_of(*c, comm_stream, compute_stream), *config, *buffers, bucket_counts,
                                         events.data(), num_buckets);
  });
}

sapipe_status c_nccl_fused_update_recheck(void* comm, const sapipe_update_config* config,
                                          const sapipe_update_buffers* buffers, int32_t sharded, void* comm_stream,
                                          void* compute_stream) {
  return guarded("ncclFusedUpdateRecheck", [&] {
    NcclCommunicator* c = nullptr;
    if (sapipe_status s = prepare_fused(comm, config, buffers, comm_stream, compute_stream, "ncclFusedUpdateRecheck", &c);
        s != SAPIPE_OK)
      return s;
    c->last_was_recheck = true;
    return enqueue_update_recheck(run_of(*c, comm_stream, compute_stream), *config, *buffers, sharded != 0);
  });
}

sapipe_status c_nccl_fused_update_result(void* comm, sapipe_nccl_step_result* out) {
  return guarded("ncclFusedUpdateResult", [&] {
    NcclCommunicator* c = nullptr;
    if (out == nullptr) return invalid("ncclFusedUpdateResult: out is null");
    if (sapipe_status s = use(comm, &c, "ncclFusedUpdateResult"); s != SAPIPE_OK) return s;
    return read_fused_step_result(run_of(*c, nullptr, nullptr), c->last_was_recheck, out);
  });
}

}  // namespace sapipe::cuda
