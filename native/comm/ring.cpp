#include "ring.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "../core/host_kernels.h"
#include "partition.h"

namespace sapipe::comm {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

using Parts = std::function<std::pair<size_t, size_t>(int)>;

// Messages a part of `count` elements is sent in: at least one (an empty part is an empty message,
// so that both sides always agree on how many messages a step has).
size_t chunks_of(size_t count, size_t chunk) { return chunk == 0 ? 1 : std::max<size_t>(1, (count + chunk - 1) / chunk); }

// Waits for every send, also after a failure (the transport must not read a buffer its owner may
// release once this returns); reports the first failure.
sapipe_status wait_all(Transport& t, std::vector<std::unique_ptr<SendHandle>>& sends, Deadline deadline, sapipe_status first) {
  for (auto& h : sends) {
    sapipe_status s = t.wait_send(*h, deadline);
    if (first == SAPIPE_OK) first = s;
  }
  sends.clear();
  return first;
}

// One ring step: sends data[send part] to the next rank while receiving the previous rank's part
// into data[recv part], either copied (scratch == null) or added into it (then scaled by `scale`,
// counting non-finite results into *non_finite). All sends are posted before the first receive,
// so that a ring of blocking receives cannot deadlock. With a chunked transport each part moves
// in chunks and chunk k is reduced, from a cache-sized scratch buffer, while later chunks arrive.
sapipe_status ring_step(Transport& t, float* data, std::pair<size_t, size_t> send, std::pair<size_t, size_t> recv,
                        std::vector<float>* scratch, float scale, int64_t* non_finite, Deadline deadline) {
  const int n = t.size(), r = t.rank();
  const size_t chunk = t.chunk_count();
  const size_t send_count = send.second - send.first, recv_count = recv.second - recv.first;
  std::vector<std::unique_ptr<SendHandle>> sends;
  const size_t send_chunks = chunks_of(send_count, chunk);
  for (size_t c = 0; c < send_chunks; ++c) {
    const size_t lo = chunk ? std::min(send_count, c * chunk) : 0;
    const size_t hi = chunk ? std::min(send_count, lo + chunk) : send_count;
    std::unique_ptr<SendHandle> h;
    sapipe_status s = t.isend(mod(r + 1, n), data + send.first + lo, hi - lo, &h);
    if (h) sends.push_back(std::move(h));
    if (s != SAPIPE_OK) return wait_all(t, sends, deadline, s);
  }
  const core::HostKernels& k = core::host_kernels();
  const size_t recv_chunks = chunks_of(recv_count, chunk);
  for (size_t c = 0; c < recv_chunks; ++c) {
    const size_t lo = chunk ? std::min(recv_count, c * chunk) : 0;
    const size_t hi = chunk ? std::min(recv_count, lo + chunk) : recv_count;
    float* dst = data + recv.first + lo;
    if (scratch == nullptr) {
      if (sapipe_status s = t.recv(mod(r - 1, n), dst, hi - lo, deadline); s != SAPIPE_OK) return wait_all(t, sends, deadline, s);
      continue;
    }
    if (scratch->size() < hi - lo) scratch->resize(hi - lo);
    if (sapipe_status s = t.recv(mod(r - 1, n), scratch->data(), hi - lo, deadline); s != SAPIPE_OK)
      return wait_all(t, sends, deadline, s);
    const float* in[2] = {dst, scratch->data()};
    const int64_t bad = k.sum(dst, in, 2, hi - lo, scale);
    if (non_finite) *non_finite += bad;
  }
  return wait_all(t, sends, deadline, SAPIPE_OK);
}

sapipe_status reduce_scatter_parts(Transport& t, float* data, const Parts& part, float scale, Deadline deadline,
                                   int64_t* non_finite) {
  const int n = t.size(), r = t.rank();
  *non_finite = 0;
  if (n == 1) {
    auto [lo, hi] = part(0);
    const float* in[1] = {data + lo};
    *non_finite = core::host_kernels().sum(data + lo, in, 1, hi - lo, scale);
    return SAPIPE_OK;
  }
  std::vector<float> scratch;
  // Step s sends part r-s-1 and receives part r-s-2, so that after n-1 steps rank r holds the
  // complete sum of its own part r.
  for (int s = 0; s < n - 1; ++s) {
    const bool last = s == n - 2;
    int64_t bad = 0;
    sapipe_status st = ring_step(t, data, part(mod(r - s - 1, n)), part(mod(r - s - 2, n)), &scratch, last ? scale : 1.0f,
                                 &bad, deadline);
    if (st != SAPIPE_OK) return st;
    if (last) *non_finite = bad;
  }
  return SAPIPE_OK;
}

sapipe_status allgather_parts(Transport& t, float* data, const Parts& part, Deadline deadline) {
  const int n = t.size(), r = t.rank();
  for (int s = 0; s < n - 1; ++s)
    if (sapipe_status st = ring_step(t, data, part(mod(r - s, n)), part(mod(r - s - 1, n)), nullptr, 1.0f, nullptr, deadline);
        st != SAPIPE_OK)
      return st;
  return SAPIPE_OK;
}

Parts partitioned(size_t count, int n) {
  return [count, n](int i) { return partition(count, n, i); };
}
Parts blocks(size_t block) {
  return [block](int i) { return std::pair<size_t, size_t>{block * static_cast<size_t>(i), block * static_cast<size_t>(i + 1)}; };
}

}  // namespace

sapipe_status ring_reduce_scatter(Transport& t, float* data, size_t count, float scale, Deadline deadline,
                                  int64_t* non_finite) {
  return reduce_scatter_parts(t, data, partitioned(count, t.size()), scale, deadline, non_finite);
}

sapipe_status ring_allgather(Transport& t, float* data, size_t count, Deadline deadline) {
  return allgather_parts(t, data, partitioned(count, t.size()), deadline);
}

sapipe_status ring_allreduce(Transport& t, float* data, size_t count, float scale, Deadline deadline,
                             int64_t* non_finite) {
  int64_t own_bad = 0;
  if (sapipe_status s = ring_reduce_scatter(t, data, count, scale, deadline, &own_bad); s != SAPIPE_OK) return s;
  if (sapipe_status s = ring_allgather(t, data, count, deadline); s != SAPIPE_OK) return s;
  // Each rank counted its own part only; one read of the result gives every rank the total
  // without another message (cheap beside a network transfer of the same bytes).
  *non_finite = t.size() == 1 ? own_bad : core::host_kernels().count_non_finite(data, count);
  return SAPIPE_OK;
}

sapipe_status ring_reduce_scatter_blocks(Transport& t, float* data, size_t block, float scale, Deadline deadline,
                                         int64_t* non_finite) {
  return reduce_scatter_parts(t, data, blocks(block), scale, deadline, non_finite);
}

sapipe_status ring_allgather_blocks(Transport& t, float* data, size_t block, Deadline deadline) {
  return allgather_parts(t, data, blocks(block), deadline);
}

sapipe_status ring_broadcast(Transport& t, float* data, size_t count, int root, Deadline deadline) {
  const int n = t.size(), r = t.rank();
  if (n == 1) return SAPIPE_OK;
  // Rank root+p receives each chunk from its predecessor and passes it on at once, so the chunks
  // flow down the chain root -> root+1 -> ... -> root-1 in a pipeline.
  const int position = mod(r - root, n);
  const size_t chunk = t.chunk_count();
  const size_t chunks = chunks_of(count, chunk);
  std::vector<std::unique_ptr<SendHandle>> sends;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t lo = chunk ? std::min(count, c * chunk) : 0;
    const size_t hi = chunk ? std::min(count, lo + chunk) : count;
    if (position > 0)
      if (sapipe_status s = t.recv(mod(r - 1, n), data + lo, hi - lo, deadline); s != SAPIPE_OK) return wait_all(t, sends, deadline, s);
    if (position < n - 1) {
      std::unique_ptr<SendHandle> h;
      sapipe_status s = t.isend(mod(r + 1, n), data + lo, hi - lo, &h);
      if (h) sends.push_back(std::move(h));
      if (s != SAPIPE_OK) return wait_all(t, sends, deadline, s);
    }
  }
  return wait_all(t, sends, deadline, SAPIPE_OK);
}

}  // namespace sapipe::comm
