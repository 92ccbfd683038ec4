#include "ring.h"

#include <vector>

#include "../cpu/kernel_table.h"
#include "partition.h"

namespace sapipe::comm {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// Sends part `send_part` to the next rank while receiving part `recv_part` from the previous one
// into `into`: the send is posted first so that a ring of blocking receives cannot deadlock.
sapipe_status exchange(Transport& t, const float* send, size_t send_count, float* into, size_t recv_count,
                       Deadline deadline) {
  const int n = t.size(), r = t.rank();
  std::unique_ptr<SendHandle> handle;
  if (sapipe_status s = t.isend(mod(r + 1, n), send, send_count, &handle); s != SAPIPE_OK) return s;
  sapipe_status received = t.recv(mod(r - 1, n), into, recv_count, deadline);
  sapipe_status sent = t.wait_send(*handle, deadline);
  return received != SAPIPE_OK ? received : sent;
}

}  // namespace

sapipe_status ring_reduce_scatter(Transport& t, float* data, size_t count, float scale, Deadline deadline,
                                  int64_t* non_finite) {
  const int n = t.size(), r = t.rank();
  const cpu::KernelTable& k = cpu::active_kernels();
  *non_finite = 0;
  if (n == 1) {
    const float* in[1] = {data};
    *non_finite = k.sum(data, in, 1, count, scale);
    return SAPIPE_OK;
  }
  std::vector<float> incoming(partition(count, n, 0).second);
  // Step s sends part r-s-1 and receives part r-s-2, so that after n-1 steps rank r holds the
  // complete sum of its own part r.
  for (int s = 0; s < n - 1; ++s) {
    auto [slo, shi] = partition(count, n, mod(r - s - 1, n));
    auto [rlo, rhi] = partition(count, n, mod(r - s - 2, n));
    if (sapipe_status st = exchange(t, data + slo, shi - slo, incoming.data(), rhi - rlo, deadline); st != SAPIPE_OK)
      return st;
    const float* in[2] = {data + rlo, incoming.data()};
    const bool last = s == n - 2;
    int64_t bad = k.sum(data + rlo, in, 2, rhi - rlo, last ? scale : 1.0f);
    if (last) *non_finite = bad;
  }
  return SAPIPE_OK;
}

sapipe_status ring_allgather(Transport& t, float* data, size_t count, Deadline deadline) {
  const int n = t.size(), r = t.rank();
  for (int s = 0; s < n - 1; ++s) {
    auto [slo, shi] = partition(count, n, mod(r - s, n));
    auto [rlo, rhi] = partition(count, n, mod(r - s - 1, n));
    if (sapipe_status st = exchange(t, data + slo, shi - slo, data + rlo, rhi - rlo, deadline); st != SAPIPE_OK)
      return st;
  }
  return SAPIPE_OK;
}

sapipe_status ring_allreduce(Transport& t, float* data, size_t count, float scale, Deadline deadline,
                             int64_t* non_finite) {
  int64_t own_bad = 0;
  if (sapipe_status s = ring_reduce_scatter(t, data, count, scale, deadline, &own_bad); s != SAPIPE_OK) return s;
  if (sapipe_status s = ring_allgather(t, data, count, deadline); s != SAPIPE_OK) return s;
  // Each rank counted its own part only; one read of the result gives every rank the total
  // without another message (cheap beside a network transfer of the same bytes).
  *non_finite = t.size() == 1 ? own_bad : cpu::active_kernels().count_non_finite(data, count);
  return SAPIPE_OK;
}

}  // namespace sapipe::comm
