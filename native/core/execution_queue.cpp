#include "execution_queue.h"

#include <utility>

#include "thread_pool.h"

namespace sapipe {

ExecutionQueue::ExecutionQueue() : worker_([this] { run(); }) {}

ExecutionQueue::~ExecutionQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_one();
  join();
}

void ExecutionQueue::join() {
  if (worker_.joinable()) worker_.join();
}

bool ExecutionQueue::submit(Task task) {
  // A task runs on its submitter's cores: the pool bound to the submitting thread, if any.
  if (std::shared_ptr<ThreadPool> pool = ThreadPool::bound())
    task = [pool = std::move(pool), inner = std::move(task)](bool previous_failed) {
      ThreadPool::Scope scope(pool);
      return inner(previous_failed);
    };
  bool taken = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!shut_down_) {
      tasks_.push_back(std::move(task));
      task = nullptr;
      taken = true;
    }
  }
  cv_.notify_one();
  // Shut down: `task` still holds the callable; it is destroyed here, outside the lock.
  return taken;
}

void ExecutionQueue::close(std::function<void()> on_exit) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shut_down_ = true;
    stopping_ = true;
    if (!exited_) {
      // A second close() before the worker ends: both callbacks run, in order.
      if (on_exit_) on_exit = [first = std::move(on_exit_), second = std::move(on_exit)] { first(); second(); };
      on_exit_ = std::move(on_exit);
      on_exit = nullptr;
    }
  }
  cv_.notify_one();
  if (on_exit) on_exit();  // the worker has ended already: nobody else would call it
}

void ExecutionQueue::shutdown() {
  std::deque<Task> dropped;
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
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) break;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    last_failed_ = task(last_failed_);
  }
  std::function<void()> on_exit;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exited_ = true;
    on_exit.swap(on_exit_);
  }
  if (on_exit) on_exit();
}

}  // namespace sapipe
