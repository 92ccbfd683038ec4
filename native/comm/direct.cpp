#include "direct.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "../core/host_kernels.h"
#include "partition.h"

namespace sapipe::comm {
namespace {

constexpr size_t kBlock = 4096;  // floats summed per pass through L1 (16 KiB)

// Sums [lo, hi) of every input, in rank order, and writes the sums to every output; returns the
// count of non-finite sums. Cache-sized blocks go through L1 scratch: each block is read from
// every input before it is written anywhere (so an output may be an input), and the inputs are
// streamed once, which runs faster than one long in-place sum over the whole range.
int64_t reduce_into(const Views& inputs, size_t lo, size_t hi, const std::vector<float*>& outputs, size_t out_lo, float scale) {
  const core::HostKernels& k = core::host_kernels();
  alignas(64) float block[kBlock];
  std::vector<const float*> in(inputs.size());
  int64_t bad = 0;
  for (size_t b = lo; b < hi; b += kBlock) {
    const size_t len = std::min(kBlock, hi - b);
    for (size_t q = 0; q < inputs.size(); ++q) in[q] = inputs[q] + b;
    bad += k.sum(block, in.data(), in.size(), len, scale);
    for (float* out : outputs) k.copy(out + out_lo + (b - lo), block, len);
  }
  return bad;
}

void copy(float* dst, const float* src, size_t count) {
  if (count > 0) core::host_kernels().copy(dst, src, count);
}

constexpr int64_t kAbandoned = INT64_MIN;  // a closing-exchange value no count can take

// The closing exchange: `mine` to every rank, theirs into *all; fails if any rank abandoned.
sapipe_status close_collective(Transport& t, int64_t mine, std::vector<int64_t>* all, Deadline deadline) {
  if (sapipe_status s = exchange_all(t, mine, all, deadline); s != SAPIPE_OK) return s;
  for (int64_t v : *all)
    if (v == kAbandoned) return SAPIPE_ERR_INTERNAL;
  return SAPIPE_OK;
}

sapipe_status barrier(Transport& t, Deadline deadline) {
  std::vector<int64_t> unused;
  return close_collective(t, 0, &unused, deadline);
}

}  // namespace

sapipe_status exchange_all(Transport& t, int64_t mine, std::vector<int64_t>* all, Deadline deadline) {
  const int n = t.size(), r = t.rank();
  all->assign(static_cast<size_t>(n), 0);
  (*all)[static_cast<size_t>(r)] = mine;
  float out[2];
  std::memcpy(out, &mine, sizeof mine);
  std::vector<std::unique_ptr<SendHandle>> sends;
  sapipe_status result = SAPIPE_OK;
  for (int q = 0; q < n && result == SAPIPE_OK; ++q) {
    if (q == r) continue;
    std::unique_ptr<SendHandle> h;
    result = t.isend(q, out, 2, &h);
    if (h) sends.push_back(std::move(h));
  }
  for (int q = 0; q < n && result == SAPIPE_OK; ++q) {
    if (q == r) continue;
    float in[2];
    result = t.recv(q, in, 2, deadline);
    if (result == SAPIPE_OK) std::memcpy(&(*all)[static_cast<size_t>(q)], in, sizeof(int64_t));
  }
  // Every send is waited for, also after a failure: `out` lives on this stack frame.
  for (auto& h : sends) {
    sapipe_status s = t.wait_send(*h, result == SAPIPE_OK ? deadline : Deadline{});
    if (result == SAPIPE_OK) result = s;
  }
  return result;
}

sapipe_status direct_abandon(Transport& t, Deadline deadline) {
  std::vector<int64_t> unused;
  sapipe_status s = exchange_all(t, kAbandoned, &unused, deadline);
  return s == SAPIPE_OK ? SAPIPE_ERR_INTERNAL : s;
}

sapipe_status direct_allreduce(Transport& t, const Views& views, size_t count, float scale, Deadline deadline, int64_t* non_finite) {
  // One pass over the own part: each cache-sized block is summed into scratch and written to every
  // rank's buffer at once. Only this rank reads or writes this part of any buffer, and it reads
  // a block before it overwrites it, so the ranks need no barrier until the end.
  auto [lo, hi] = partition(count, t.size(), t.rank());
  const int64_t bad = reduce_into(views, lo, hi, views, lo, scale);
  // The exchange of non-finite counts is also the closing barrier: once it is done, every rank
  // has finished writing into this rank's buffer.
  std::vector<int64_t> counts;
  if (sapipe_status s = close_collective(t, bad, &counts, deadline); s != SAPIPE_OK) return s;
  *non_finite = 0;
  for (int64_t c : counts) *non_finite += c;
  return SAPIPE_OK;
}

sapipe_status direct_reduce_scatter(Transport& t, const Views& views, size_t count, float scale, Deadline deadline,
                                    int64_t* non_finite) {
  auto [lo, hi] = partition(count, t.size(), t.rank());
  float* own = views[static_cast<size_t>(t.rank())];
  *non_finite = reduce_into(views, lo, hi, {own}, lo, scale);
  return barrier(t, deadline);
}

sapipe_status direct_allgather(Transport& t, const Views& views, size_t count, Deadline deadline) {
  const int n = t.size(), r = t.rank();
  float* own = views[static_cast<size_t>(r)];
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    auto [lo, hi] = partition(count, n, q);
    copy(own + lo, views[static_cast<size_t>(q)] + lo, hi - lo);
  }
  return barrier(t, deadline);
}

sapipe_status direct_reduce_scatter_blocks(Transport& t, const Views& inputs, size_t block, float* output, float scale,
                                           Deadline deadline, int64_t* non_finite) {
  const size_t lo = block * static_cast<size_t>(t.rank());
  *non_finite = reduce_into(inputs, lo, lo + block, {output}, 0, scale);
  return barrier(t, deadline);
}

sapipe_status direct_allgather_blocks(Transport& t, const Views& inputs, size_t block, float* output, Deadline deadline) {
  for (size_t q = 0; q < inputs.size(); ++q) copy(output + q * block, inputs[q], block);
  return barrier(t, deadline);
}

sapipe_status direct_broadcast(Transport& t, const Views& views, size_t count, int root, Deadline deadline) {
  if (t.rank() != root) copy(views[static_cast<size_t>(t.rank())], views[static_cast<size_t>(root)], count);
  return barrier(t, deadline);
}

}  // namespace sapipe::comm
