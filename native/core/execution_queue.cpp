#include "execution_queue.h"

#include <utility>

namespace sapipe {

ExecutionQueue::ExecutionQueue() : worker_([this] { run(); }) {}

ExecutionQueue::~ExecutionQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (worker_.joinable()) worker_.join();
}

void ExecutionQueue::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!shut_down_) {
      tasks_.push_back(std::move(task));
      task = nullptr;
    }
  }
  cv_.notify_one();
  // Shut down: `task` still holds the callable; it is destroyed here, outside the lock.
}

void ExecutionQueue::shutdown() {
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shut_down_ = true;
    stopping_ = true;
    dropped.swap(tasks_);
  }
  cv_.notify_one();
  dropped.clear();  // outside the lock: a task's destructor may do real work
}

void ExecutionQueue::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace sapipe
