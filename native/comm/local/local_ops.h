// What one rank of a local group runs on its queue, without Node: a collective by the group's own
// algorithm (every rank reads its peers' buffers in place) or by the ring algorithm (../ring.h)
// over the group's channels, the user's point-to-point messages, and the fused steps' job checked
// and planned.
// native/addon/comm_local_binding.cpp is its JS face.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "local_group.h"

namespace sapipe::comm::local {

// Runs one collective of `rank`: by the group, or with `ring` (an all-reduce only) by the ring
// algorithm, after a barrier at which every rank checks that all passed the same size (so ranks
// that disagree all fail alike before any data moves). *non_finite counts the non-finite results.
sapipe_status run_collective(const std::shared_ptr<Group>& group, int rank, const CollectiveArgs& args, bool ring, Deadline deadline,
                             int64_t* non_finite, std::string* detail);

// The user's point-to-point messages (Group::kUserChannel): a send completes once the peer has
// taken the message; a receive once it has copied one in.
sapipe_status send_to_peer(Group& group, int rank, int peer, const float* data, size_t count, Deadline deadline, std::string* detail);
sapipe_status recv_from_peer(Group& group, int rank, int peer, float* data, size_t count, Deadline deadline, std::string* detail);

// The job of a fused step, kind kReduceUpdate (the sharded step) or kUpdateFromParts (the
// replicated step's second pass), from the update's configuration and buffers: checked as the
// kernels check them, refused where the step cannot run that way, and planned; and the
// collective's arguments that carry it (args->job points at job; args->scale is left to the
// caller). On failure *detail says why, or is empty when the configuration or buffers themselves
// are invalid.
sapipe_status prepare_update_job(CollectiveKind kind, const sapipe_update_config& config, const sapipe_update_buffers& buffers,
                                 ReduceUpdateJob* job, CollectiveArgs* args, std::string* detail);

}  // namespace sapipe::comm::local
