#include "nccl_ops.h"

#include <chrono>
#include <string>

namespace sapipe::comm::nccl {
namespace {

bool counts_result(int32_t kind) { return kind == kNcclAllReduce || kind == kNcclReduceScatter; }

}  // namespace

Clock::time_point operation_deadline(const NcclState& st) { return Clock::now() + std::chrono::milliseconds(st.timeout_ms); }

void finish_operation(NcclState& st) {
  if (st.destroy_requested.load()) {
    std::lock_guard<std::mutex> lock(st.mutex);
    st.release_locked("destroyed");
  }
}

void request_destroy(NcclState& st) {
  st.destroy_requested.store(true);
  if (st.in_flight.load() == 0) {
    std::lock_guard<std::mutex> lock(st.mutex);
    st.release_locked("destroyed");
  }
}

Outcome init_communicator(NcclState& st, const uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES]) {
  const sapipe_cuda_plugin_v1* cuda = st.cuda;
  if (cuda->set_device(st.device) != SAPIPE_OK) return failed(SAPIPE_ERR_BACKEND_UNAVAILABLE, cuda->last_error());
  void* comm_stream = nullptr;
  void* compute_stream = nullptr;
  void* word = nullptr;
  if (cuda->stream_create(&comm_stream) != SAPIPE_OK || cuda->stream_create(&compute_stream) != SAPIPE_OK ||
      cuda->malloc_device(&word, sizeof(int64_t)) != SAPIPE_OK) {
    Outcome out = failed(SAPIPE_ERR_INTERNAL, cuda->last_error());
    if (comm_stream) cuda->stream_destroy(comm_stream);
    if (compute_stream) cuda->stream_destroy(compute_stream);
    return out;
  }
  void* comm = nullptr;
  const sapipe_status s = cuda->nccl_comm_init_rank(&comm, st.size, id, st.rank);
  std::lock_guard<std::mutex> lock(st.mutex);
  st.comm_stream = comm_stream;
  st.compute_stream = compute_stream;
  st.count_word = static_cast<int64_t*>(word);
  if (s != SAPIPE_OK) {
    Outcome out = failed(s, std::string("ncclCommInitRank: ") + cuda->last_error());
    st.release_locked(out.message);
    return out;
  }
  st.comm = comm;
  return {};
}

Outcome run_collective(NcclState& st, const NcclCollective& x, Clock::time_point deadline, int64_t* non_finite) {
  void* comm = nullptr;
  if (Outcome u = usable(st, &comm); u.status != SAPIPE_OK) return u;
  const sapipe_cuda_plugin_v1* c = st.cuda;
  void* s = st.comm_stream;
  sapipe_status status = SAPIPE_OK;
  const char* what = "";
  switch (x.kind) {
    case kNcclAllReduce: status = c->nccl_all_reduce(comm, x.a, x.a, x.count, x.arg, s), what = "allreduce"; break;
    case kNcclReduceScatter: status = c->nccl_reduce_scatter(comm, x.a, x.b, x.count, x.arg, s), what = "reduceScatter"; break;
    case kNcclAllGather: status = c->nccl_all_gather(comm, x.a, x.b, x.count, s), what = "allgather"; break;
    case kNcclBroadcast: status = c->nccl_broadcast(comm, x.a, x.a, x.count, x.arg, s), what = "broadcast"; break;
    case kNcclSend: status = c->nccl_send(comm, x.a, x.count, x.arg, s), what = "send"; break;
    case kNcclRecv: status = c->nccl_recv(comm, x.a, x.count, x.arg, s), what = "recv"; break;
    default: return failed(SAPIPE_ERR_INVALID_ARGUMENT, "unknown collective");
  }
  if (status != SAPIPE_OK) return failed(status, std::string(what) + ": " + c->last_error());
  if (counts_result(x.kind)) {
    float* result = x.kind == kNcclAllReduce ? x.a : x.b;
    if (c->count_non_finite(result, x.count, st.count_word, s) != SAPIPE_OK)
      return failed(SAPIPE_ERR_INTERNAL, std::string(what) + ": " + c->last_error());
  }
  if (Outcome w = wait_for(st, comm, {s}, deadline, what); w.status != SAPIPE_OK) return w;
  if (counts_result(x.kind)) {
    // The stream is idle: this copy and synchronize return at once.
    if (c->copy_to_host(non_finite, st.count_word, sizeof *non_finite, s) != SAPIPE_OK || c->stream_synchronize(s) != SAPIPE_OK)
      return failed(SAPIPE_ERR_INTERNAL, std::string(what) + ": " + c->last_error());
  }
  return {};
}

Outcome run_fused_step(NcclState& st, const FusedStep& step, Clock::time_point deadline, sapipe_nccl_step_result* result) {
  void* comm = nullptr;
  if (Outcome u = usable(st, &comm); u.status != SAPIPE_OK) return u;
  const sapipe_cuda_plugin_v1* c = st.cuda;
  const char* what = step.recheck ? "allreduceAndStep (recheck)" : "allreduceAndStep";
  const int32_t sharded = step.sharded ? 1 : 0;
  if (!step.ready.empty() && (step.recheck || step.sharded || step.ready.size() != step.buckets.size()))
    return failed(SAPIPE_ERR_INVALID_ARGUMENT, std::string(what) + ": events are for the replicated step, one per bucket");
  const sapipe_status s =
      step.recheck ? c->nccl_fused_update_recheck(comm, &step.config, &step.buffers, sharded, st.comm_stream, st.compute_stream)
      : !step.ready.empty()
          ? c->nccl_fused_update_after(comm, &step.config, &step.buffers, step.buckets.data(), step.ready.data(), step.buckets.size(),
                                       st.comm_stream, st.compute_stream)
          : c->nccl_fused_update(comm, &step.config, &step.buffers, step.buckets.data(), step.buckets.size(), sharded,
                                 st.comm_stream, st.compute_stream);
  if (s != SAPIPE_OK) return failed(s, std::string(what) + ": " + c->last_error());
  if (Outcome w = wait_for(st, comm, {st.comm_stream, st.compute_stream}, deadline, what); w.status != SAPIPE_OK) return w;
  if (c->nccl_fused_update_result(comm, result) != SAPIPE_OK) return failed(SAPIPE_ERR_INTERNAL, c->last_error());
  return {};
}

Outcome stage_copy(NcclState& st, float* device, float* host, size_t count, bool to_device, Clock::time_point deadline) {
  void* comm = nullptr;
  if (Outcome u = usable(st, &comm); u.status != SAPIPE_OK) return u;
  const sapipe_cuda_plugin_v1* c = st.cuda;
  void* s = st.compute_stream;
  const char* what = to_device ? "stage to device" : "stage to host";
  const size_t bytes = count * sizeof(float);
  const sapipe_status status = to_device ? c->copy_to_device(device, host, bytes, s) : c->copy_to_host(host, device, bytes, s);
  if (status != SAPIPE_OK) return failed(status, std::string(what) + ": " + c->last_error());
  return wait_for(st, comm, {s}, deadline, what);
}

}  // namespace sapipe::comm::nccl
