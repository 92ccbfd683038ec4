// An in-order execution queue: one native worker thread runs submitted tasks one after another,
// like a CUDA stream. The addon resolves a Promise when each task completes.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace sapipe {

class ExecutionQueue {
 public:
  ExecutionQueue();
  ~ExecutionQueue();  // runs what is queued (unless shut down), then joins
  ExecutionQueue(const ExecutionQueue&) = delete;
  ExecutionQueue& operator=(const ExecutionQueue&) = delete;

  // After shutdown() the task is destroyed at once, without running.
  void submit(std::function<void()> task);

  // Stops taking tasks and destroys, on the calling thread and without running them, those not
  // started yet. Returns without waiting for the task in progress: the destructor joins.
  void shutdown();

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  bool shut_down_ = false;
  std::thread worker_;
};

}  // namespace sapipe
