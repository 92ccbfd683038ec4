#include "local_ops.h"

#include "../../core/update_plan.h"
#include "../ring.h"
#include "local_transport.h"

namespace sapipe::comm::local {

sapipe_status run_collective(const std::shared_ptr<Group>& group, int rank, const CollectiveArgs& args, bool ring, Deadline deadline,
                             int64_t* non_finite, std::string* detail) {
  if (!ring) return group->collective(rank, args, deadline, non_finite, detail);
  if (args.kind != CollectiveKind::kAllreduce) {
    *detail = "the ring algorithm is offered for allreduce only";
    return SAPIPE_ERR_INVALID_ARGUMENT;
  }
  // Agree on sizes first (a barrier checks them on every rank alike), then run the ring.
  int64_t ignored = 0;
  CollectiveArgs probe;
  probe.kind = CollectiveKind::kBarrier;
  probe.input_count = args.input_count;  // validated for equality across ranks
  if (sapipe_status s = group->collective(rank, probe, deadline, &ignored, detail); s != SAPIPE_OK) return s;
  LocalTransport t(group, rank, detail);
  return ring_allreduce(t, args.input, args.input_count, args.scale, deadline, non_finite);
}

sapipe_status send_to_peer(Group& group, int rank, int peer, const float* data, size_t count, Deadline deadline, std::string* detail) {
  std::shared_ptr<SendSlot> slot;
  sapipe_status s = group.post_send(rank, peer, Group::kUserChannel, data, count, &slot, detail);
  if (s == SAPIPE_OK) s = group.wait_send(rank, peer, Group::kUserChannel, slot, deadline, detail);
  return s;
}

sapipe_status recv_from_peer(Group& group, int rank, int peer, float* data, size_t count, Deadline deadline, std::string* detail) {
  return group.recv(rank, peer, Group::kUserChannel, data, count, deadline, detail);
}

sapipe_status prepare_update_job(CollectiveKind kind, const sapipe_update_config& config, const sapipe_update_buffers& buffers,
                                 ReduceUpdateJob* job, CollectiveArgs* args, std::string* detail) {
  const bool sharded = kind == CollectiveKind::kReduceUpdate;
  if (!sharded && kind != CollectiveKind::kUpdateFromParts) {
    *detail = "not a fused step's kind";
    return SAPIPE_ERR_INVALID_ARGUMENT;
  }
  job->config = config;
  job->buffers = buffers;
  if (sapipe_status s = core::check_update_config(config); s != SAPIPE_OK) return s;
  if (sapipe_status s = core::check_update_buffers(config, buffers); s != SAPIPE_OK) return s;
  if (sharded && (core::update_reads_local_grad(config) || buffers.prev_local_grad != nullptr)) {
    *detail = "weight prediction with a local or local-prev-sync estimate depends on each rank's own gradient over the whole model, "
              "so it cannot be sharded; use the prev-sync estimate or the replicated update";
    return SAPIPE_ERR_INVALID_ARGUMENT;
  }
  if (buffers.weights_in != nullptr) {
    *detail = "the fused step updates the weights in place (no weightsIn)";
    return SAPIPE_ERR_INVALID_ARGUMENT;
  }
  job->plan = core::make_update_plan(config);
  // Sharded, each predicted block is read back at once to copy it to the peers.
  if (sharded) job->plan.stream_predicted = false;
  args->kind = kind;
  args->input = const_cast<float*>(buffers.grad) + buffers.offset;
  args->input_count = buffers.count;
  args->job = job;
  return SAPIPE_OK;
}

}  // namespace sapipe::comm::local
