// A fixed pool of worker threads that run one data-parallel job at a time.
// Kernels split [0, n) into per-thread ranges aligned to a cache line so that no two threads
// write the same line. The caller's thread takes part as thread 0, so a pool of T threads starts
// T - 1 workers. Jobs are serialised: the execution queue's worker and the JS thread's sync path
// may both submit work, one after the other.
//
// Waking a sleeping thread costs tens of microseconds on virtual machines, and one optimizer step
// is two jobs back to back (the non-finite scan, then the update), so workers and the caller spin
// briefly before they sleep.
//
// Several threads computing at once (pipeline stages as worker threads) would queue for the one
// process-wide pool, job by job, each waiting while the other's job runs and its spinning workers
// take the cores. So a thread can have a pool of its own (bind_to_this_thread): a "core set" of
// that many threads, 1 meaning its kernels run on the calling thread alone. The kernels ask for
// current(): the calling thread's own pool if it has one, else the global one. An execution queue
// carries its submitter's pool to the task (bound()), so a queued step runs on the same cores.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
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

  // The pool the kernels called on this thread use: its own (bind_to_this_thread, or a Scope) if
  // it has one, else global().
  static ThreadPool& current();
  // Gives the calling thread a pool of its own of `threads` threads (the caller and threads - 1
  // workers; 1: no workers), or none with 0 (back to the global pool). Returns the size it got
  // (fewer where threads cannot be created). Throws std::bad_alloc.
  static int bind_to_this_thread(int threads);
  // The calling thread's own pool (null without one), for a queue to run its tasks on.
  static std::shared_ptr<ThreadPool> bound();

  // Runs a scope on `pool` (null: leaves the thread's binding as it is), restoring the binding after.
  class Scope {
   public:
    explicit Scope(std::shared_ptr<ThreadPool> pool);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    std::shared_ptr<ThreadPool> saved_;
    bool active_;
  };

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
