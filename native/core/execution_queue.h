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
  ~ExecutionQueue();  // runs what is queued, then joins
  ExecutionQueue(const ExecutionQueue&) = delete;
  ExecutionQueue& operator=(const ExecutionQueue&) = delete;

  void submit(std::function<void()> task);

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace sapipe
