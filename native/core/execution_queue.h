// An in-order execution queue: one native worker thread runs submitted tasks one after another,
// like a CUDA stream. The addon resolves a Promise when each task completes. Each task reports
// whether it failed, and the next task is told (previous_failed), so an operation queued behind
// another can act on its outcome (a latch signal behind a reduction, core/latch.h).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace sapipe {

class ExecutionQueue {
 public:
  // Throws std::system_error when the thread cannot be created (a thread or pids limit).
  ExecutionQueue();
  ~ExecutionQueue();  // runs what is queued (unless shut down), then joins
  ExecutionQueue(const ExecutionQueue&) = delete;
  ExecutionQueue& operator=(const ExecutionQueue&) = delete;

  // A task: told whether the task run just before it on this queue failed (false for the first),
  // it returns whether it failed itself.
  using Task = std::function<bool(bool previous_failed)>;

  // Returns false, and destroys the task at once without running it, after shutdown() or close().
  // The task's kernels use the submitting thread's pool (ThreadPool::bound()), if it has one.
  bool submit(Task task);

  // Stops taking tasks, runs those already queued, then ends the worker thread; its last act is
  // to call on_exit (on the worker thread), after which join() returns at once. For an owner
  // that must release the thread without blocking on the task in progress.
  void close(std::function<void()> on_exit);

  // Waits for the worker thread to end (after close() or shutdown()). Idempotent.
  void join();

  // Stops taking tasks and destroys, on the calling thread and without running them, those not
  // started yet. Returns without waiting for the task in progress: the destructor joins.
  void shutdown();

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stopping_ = false;
  bool shut_down_ = false;  // no task is taken any more
  bool exited_ = false;     // the worker left its loop; on_exit_ is no longer read
  bool last_failed_ = false;  // on the worker thread only: whether the last task run failed
  std::function<void()> on_exit_;
  std::thread worker_;
};

}  // namespace sapipe
