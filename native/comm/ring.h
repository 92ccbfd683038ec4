// The ring all-reduce, reduce-scatter and all-gather, written once against Transport so that
// every transport (UCX now, others later) gets them. Bandwidth-optimal: each rank sends and
// receives 2(n-1)/n of the buffer for an all-reduce (nccl-tests' busbw counts exactly this).
#pragma once

#include <cstdint>

#include "transport.h"

namespace sapipe::comm {

// In place: data[0, count) becomes scale * (sum over ranks). *non_finite receives the count of
// NaN/Inf results of the whole buffer (the same on every rank).
sapipe_status ring_allreduce(Transport& t, float* data, size_t count, float scale, Deadline deadline,
                             int64_t* non_finite);
// In place: after the call, rank r's part partition(count, n, r) of data holds the reduced
// values; the other parts hold partial sums. *non_finite counts the own part only.
sapipe_status ring_reduce_scatter(Transport& t, float* data, size_t count, float scale, Deadline deadline,
                                  int64_t* non_finite);
// In place: every rank's own part partition(count, n, r) is copied to every other rank.
sapipe_status ring_allgather(Transport& t, float* data, size_t count, Deadline deadline);

// The same over parts of `block` elements each (part i = [i*block, (i+1)*block) of n*block), the
// layout of Communicator.reduceScatter's input and allgather's output.
sapipe_status ring_reduce_scatter_blocks(Transport& t, float* data, size_t block, float scale, Deadline deadline,
                                         int64_t* non_finite);
sapipe_status ring_allgather_blocks(Transport& t, float* data, size_t block, Deadline deadline);
// In place: every rank's data[0, count) becomes root's, pipelined in chunks along the ring.
sapipe_status ring_broadcast(Transport& t, float* data, size_t count, int root, Deadline deadline);

}  // namespace sapipe::comm
