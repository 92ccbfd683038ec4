// What the CPU model operations built of SGEMMs share (nn_ops.cpp's convolutions,
// nn_attention.cpp): units of work split over the thread pool, each unit whole in one call; a
// product on the calling thread (the callers are themselves pool jobs); the first error any job
// saw.
#pragma once

#include <atomic>
#include <cstddef>

#include "../core/thread_pool.h"
#include "gemm.h"
#include "sapipe/status.h"

namespace sapipe::cpu {

// Runs body(thread, begin, end) over units [0, units) split across the thread pool, each unit
// whole in one call, so every unit is written by one thread whatever the split. parallel_for runs
// fewer than kInlineThreshold elements inline: each unit counts as `work` elements (by default
// that threshold, so any two units may split; a unit's rough size keeps small problems on the
// calling thread).
template <class Body>
void split_units(size_t units, Body&& body, size_t work = ThreadPool::kInlineThreshold) {
  ThreadPool::current().parallel_for(units * work, work, [&](int t, size_t lo, size_t hi) { body(t, lo / work, hi / work); });
}

// C = alpha op(A) op(B) + beta C on the calling thread.
inline sapipe_status serial_product(bool ta, bool tb, size_t m, size_t n, size_t k, float alpha, const float* a, size_t lda,
                                    const float* b, size_t ldb, float beta, float* c, size_t ldc) {
  GemmArgs g;
  g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.beta = beta;
  g.a = a, g.lda = lda, g.b = b, g.ldb = ldb, g.c = c, g.ldc = ldc;
  return sgemm_serial(g);
}

// The first error of the jobs, kept by whichever thread saw it.
struct FirstError {
  std::atomic<int> status{SAPIPE_OK};
  void set(sapipe_status st) {
    int ok = SAPIPE_OK;
    if (st != SAPIPE_OK) status.compare_exchange_strong(ok, st);
  }
  sapipe_status get() const { return static_cast<sapipe_status>(status.load()); }
};

}  // namespace sapipe::cpu
