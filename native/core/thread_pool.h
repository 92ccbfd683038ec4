// A fixed pool of worker threads that run one data-parallel job at a time.
// Kernels split [0, n) into per-thread ranges aligned to a cache line so that no two threads
// write the same line. The caller's thread takes part as thread 0, so a pool of T threads starts
// T - 1 workers. Jobs are serialised: the execution queue's worker and the JS thread's sync path
// may both submit work, one after the other.
//
// Waking a sleeping thread costs tens of microseconds on virtual machines, and one optimizer step
// is two jobs back to back (the non-finite scan, then the update), so workers and the caller spin
// briefly before they sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sapipe {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }

  // Runs body(thread_index, begin, end) over [0, n) split into at most size() ranges whose
  // boundaries are multiples of `align` elements. Small n runs inline on the caller's thread.
  void parallel_for(size_t n, size_t align, const std::function<void(int, size_t, size_t)>& body);

  // The process-wide pool: SAPIPE_NUM_THREADS threads if set, else the hardware concurrency.
  static ThreadPool& global();
  // Threads the global pool was (or will be) created with.
  static int configured_threads();

  // Jobs smaller than this many elements run on one thread: waking workers costs more.
  static constexpr size_t kInlineThreshold = 1 << 15;

 private:
  void worker_loop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex submit_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int)>* job_ = nullptr;  // published by generation_
  int job_threads_ = 0;
  std::atomic<unsigned long> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace sapipe
