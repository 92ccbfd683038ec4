// Collectives for ranks that can read each other's buffers: ranks of one machine whose buffers
// lie in shared memory that every rank has mapped (Communicator.allocate on the ucx backend).
// No bytes of data travel in messages. Each rank reduces its own part by reading that part of
// every rank's buffer, and then copies the other parts from their owners, as the local backend
// does between threads. Tiny all-to-all messages over the transport order the phases: a rank
// reads a peer's part only once the peer has finished writing it, and returns only once every
// peer has finished reading its buffer, so the caller may reuse it at once.
//
// `views[q]` is rank q's buffer as mapped in this process (views[rank] is the rank's own). Every
// rank has entered the collective when these run (the header swap before them is a barrier).
#pragma once

#include <cstdint>
#include <vector>

#include "transport.h"

namespace sapipe::comm {

using Views = std::vector<float*>;

// Every rank sends `mine` to every other rank and receives theirs into (*all)[q]; a barrier too.
sapipe_status exchange_all(Transport& t, int64_t mine, std::vector<int64_t>* all, Deadline deadline);

// For a rank that cannot run its side of a direct collective that its peers run (it lacks a
// peer's mapping: an internal error): it takes part in the closing exchange only, with a mark
// that makes every rank's collective fail with SAPIPE_ERR_INTERNAL instead of waiting for it.
sapipe_status direct_abandon(Transport& t, Deadline deadline);

// The ring.h collectives, computed the same way (each part summed over ranks in rank order).
sapipe_status direct_allreduce(Transport& t, const Views& views, size_t count, float scale, Deadline deadline, int64_t* non_finite);
sapipe_status direct_reduce_scatter(Transport& t, const Views& views, size_t count, float scale, Deadline deadline,
                                    int64_t* non_finite);
sapipe_status direct_allgather(Transport& t, const Views& views, size_t count, Deadline deadline);
// Communicator.reduceScatter / allgather: views are the n*block inputs (reduce-scatter) or the
// block inputs (all-gather); `output` is this rank's own, unshared, output.
sapipe_status direct_reduce_scatter_blocks(Transport& t, const Views& inputs, size_t block, float* output, float scale,
                                           Deadline deadline, int64_t* non_finite);
sapipe_status direct_allgather_blocks(Transport& t, const Views& inputs, size_t block, float* output, Deadline deadline);
sapipe_status direct_broadcast(Transport& t, const Views& views, size_t count, int root, Deadline deadline);

}  // namespace sapipe::comm
