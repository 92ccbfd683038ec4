#include "thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <system_error>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SAPIPE_CPU_RELAX() _mm_pause()
#else
#define SAPIPE_CPU_RELAX() std::this_thread::yield()
#endif

namespace sapipe {
namespace {

// How long a thread polls before it sleeps on a condition variable.
constexpr auto kSpin = std::chrono::microseconds(50);

template <class Ready>
bool spin_until(Ready ready) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    SAPIPE_CPU_RELAX();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= until) return ready();
  }
}

// The calling thread's own pool. A shared_ptr: queued tasks keep it alive after the thread rebinds.
thread_local std::shared_ptr<ThreadPool> t_bound;
thread_local int t_requested = 0;  // what t_bound was asked for (it may hold fewer threads)

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) {
    try {
      workers_.emplace_back([this, i] { worker_loop(i); });
    } catch (const std::system_error&) {
      // A thread or pids limit: the pool runs with the threads it got (the caller's thread at
      // least) rather than ending the process; the kernels are only slower.
      num_threads_ = i;
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  unsigned long seen = 0;
  for (;;) {
    auto started = [&] { return stopping_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(started)) {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, started);
    }
    if (stopping_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    if (index >= job_threads_) continue;
    (*job_)(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Taking the lock orders this notification after the caller's check-then-wait.
      std::lock_guard<std::mutex> lock(mutex_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(size_t n, size_t align,
                              const std::function<void(int, size_t, size_t)>& body) {
  if (n == 0) return;
  if (align == 0) align = 1;
  size_t threads = static_cast<size_t>(num_threads_);
  if (n < kInlineThreshold || threads == 1) {
    body(0, 0, n);
    return;
  }
  size_t chunk = (n + threads - 1) / threads;
  chunk = (chunk + align - 1) / align * align;
  const int used = static_cast<int>((n + chunk - 1) / chunk);
  const std::function<void(int)> job = [&](int index) {
    size_t begin = static_cast<size_t>(index) * chunk;
    size_t end = std::min(n, begin + chunk);
    if (begin < end) body(index, begin, end);
  };
  std::lock_guard<std::mutex> submit(submit_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &job;
    job_threads_ = used;
    pending_.store(used - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  job(0);
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, done);
  }
  job_ = nullptr;
}

int ThreadPool::configured_threads() {
  if (const char* env = std::getenv("SAPIPE_NUM_THREADS")) {
    char* end = nullptr;
    long value = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && value >= 1 && value <= 1024) return static_cast<int>(value);
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

ThreadPool& ThreadPool::current() { return t_bound ? *t_bound : global(); }

int ThreadPool::bind_to_this_thread(int threads) {
  if (threads <= 0) {
    t_bound.reset();
    t_requested = 0;
    return global().size();
  }
  if (!t_bound || t_requested != threads) {
    t_bound.reset();  // its workers end before the new ones start
    t_bound = std::make_shared<ThreadPool>(threads);
    t_requested = threads;
  }
  return t_bound->size();
}

std::shared_ptr<ThreadPool> ThreadPool::bound() { return t_bound; }

ThreadPool::Scope::Scope(std::shared_ptr<ThreadPool> pool) : active_(pool != nullptr) {
  if (active_) {
    saved_ = std::move(t_bound);
    t_bound = std::move(pool);
  }
}

ThreadPool::Scope::~Scope() {
  if (active_) t_bound = std::move(saved_);
}

ThreadPool& ThreadPool::global() {
  // Never destroyed: a queue's worker thread may still be inside a job while the process exits.
  static ThreadPool* pool = new ThreadPool(configured_threads());
  return *pool;
}

}  // namespace sapipe
