#include "schedule_check.h"

#include <atomic>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "../core/execution_queue.h"
#include "../core/latch.h"
#include "../core/queued_update.h"
#include "../core/thread_pool.h"
#include "../cpu/gemm.h"
#include "sapipe/kernels.h"
#include "variants.h"

namespace sapipe::tests {
namespace {

using namespace std::chrono_literals;

// A gate a test opens once: tasks block on it to hold a queue busy.
struct Gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      open = true;
    }
    cv.notify_all();
  }
};

core::LatchClock::time_point in(std::chrono::milliseconds ms) { return core::LatchClock::now() + ms; }

}  // namespace

void check_execution_queue(Checks& t) {
  {
    // In order, each task told whether the one before it failed.
    std::vector<int> order;
    std::vector<bool> told;
    {
      ExecutionQueue q;
      const bool fails[] = {false, true, false, true, true, false};
      for (int i = 0; i < 6; ++i)
        q.submit([&, i, fail = fails[i]](bool previous_failed) {
          order.push_back(i);
          told.push_back(previous_failed);
          return fail;
        });
    }  // the destructor runs what is queued, then joins
    t.expect(order == std::vector<int>({0, 1, 2, 3, 4, 5}), "an execution queue runs its tasks in submission order");
    t.expect(told == std::vector<bool>({false, false, true, false, true, true}),
             "each task is told whether the task just before it failed");
  }
  {
    // shutdown(): the task in progress finishes, those not started are destroyed unrun.
    auto gate = std::make_shared<Gate>();
    std::promise<void> started;
    std::atomic<bool> second_ran{false};
    auto dropped = std::make_shared<int>(0);
    std::weak_ptr<int> watch = dropped;
    auto q = std::make_unique<ExecutionQueue>();
    q->submit([gate, &started](bool) {
      started.set_value();
      gate->wait();
      return false;
    });
    q->submit([&second_ran, dropped](bool) {
      second_ran = true;
      return false;
    });
    dropped.reset();
    started.get_future().wait();
    q->shutdown();
    t.expect(watch.expired(), "shutdown() destroys the tasks not started, at once");
    t.expect(!q->submit([](bool) { return false; }), "submit() after shutdown() refuses the task");
    gate->release();
    q.reset();
    t.expect(!second_ran.load(), "a task dropped by shutdown() never runs");
  }
  {
    // close(): runs what is queued, then its callback on the worker thread, then join() returns.
    std::vector<int> seen;
    std::promise<void> exited;
    ExecutionQueue q;
    q.submit([&](bool) {
      seen.push_back(1);
      return false;
    });
    q.close([&] {
      seen.push_back(2);
      exited.set_value();
    });
    t.expect(exited.get_future().wait_for(5s) == std::future_status::ready, "close() calls back once the queue has drained");
    q.join();
    t.expect(seen == std::vector<int>({1, 2}), "close() lets the queued tasks run first");
    t.expect(!q.submit([](bool) { return false; }), "submit() after close() refuses the task");
  }
}

void check_latches(Checks& t) {
  {
    std::vector<float> latch(3, 0.0f);
    t.expect(core::wait_for_latch(latch.data(), 0, in(1ms)) == SAPIPE_ERR_TIMEOUT, "an unsignalled latch times out");
    core::signal_latch(latch.data(), 0, false);
    t.expect(latch[0] == 1.0f && core::wait_for_latch(latch.data(), 0, in(1ms)) == SAPIPE_OK, "a signalled latch releases its waiter");
    core::signal_latch(latch.data(), 1, true);
    t.expect(latch[1] == -1.0f && core::wait_for_latch(latch.data(), 1, in(1ms)) == SAPIPE_ERR_DISPOSED,
             "a signal behind a failed operation fails its waiter");
    core::signal_latch(latch.data(), 2, false);
    t.expect(latch[2] == -1.0f, "a signal after a failed signal of the chain fails too");
  }
  {
    std::vector<float> latch(1, 0.0f);
    core::drop_latch_signal(latch.data(), 0);
    t.expect(core::wait_for_latch(latch.data(), 0, in(1ms)) == SAPIPE_ERR_DISPOSED, "a dropped signal fails its waiter at once");
  }
  {
    // Across queues, as the overlapped step runs: the update waits on one queue for the signal
    // queued behind a reduction on another; the reduction's write is seen by the waiter.
    std::vector<float> latch(2, 0.0f), bucket(1, 0.0f);
    std::vector<sapipe_status> waited(2, SAPIPE_ERR_INTERNAL);
    std::vector<float> seen(2, 0.0f);
    {
      ExecutionQueue updates, reductions;
      for (size_t slot = 0; slot < 2; ++slot)
        updates.submit([&, slot](bool) {
          waited[slot] = core::wait_for_latch(latch.data(), slot, in(10s));
          seen[slot] = bucket[0];
          return waited[slot] != SAPIPE_OK;
        });
      std::this_thread::sleep_for(5ms);  // the update is waiting before the reduction runs
      reductions.submit([&](bool) {
        bucket[0] = 42.0f;
        return false;
      });
      reductions.submit([&](bool previous_failed) {
        core::signal_latch(latch.data(), 0, previous_failed);
        return false;
      });
      reductions.submit([](bool) { return true; });  // a failed reduction
      reductions.submit([&](bool previous_failed) {
        core::signal_latch(latch.data(), 1, previous_failed);
        return false;
      });
    }
    t.expect(waited[0] == SAPIPE_OK && seen[0] == 42.0f, "an update waiting on another queue runs after the reduction it waits for");
    t.expect(waited[1] == SAPIPE_ERR_DISPOSED, "an update behind a failed reduction fails instead of running");
  }
}

void check_queued_update(Checks& t) {
  {
    core::GradClip clip{1.0, 0.5, 0.25};
    double norm = 0;
    float scale = core::clipped_grad_scale(clip, 4.0, &norm);  // norm = 2 * 0.5 * 0.25 = 0.25
    t.expect(norm == 0.25 && scale == static_cast<float>(0.5 * 0.25), "a norm below max_norm leaves the scale base * unscale");
    scale = core::clipped_grad_scale(clip, 400.0, &norm);  // norm = 20 * 0.125 = 2.5
    t.expect(norm == 2.5 && scale == static_cast<float>(0.5 * (0.25 * (1.0 / (2.5 + 1e-6)))),
             "a norm above max_norm scales the step down to max_norm");
    scale = core::clipped_grad_scale(clip, INFINITY, &norm);
    t.expect(std::isinf(norm) && scale == static_cast<float>(0.5 * 0.25), "a non-finite norm is not clipped (the guard skips the step)");
  }
  const Variant variant = update_variants()[0];
  const size_t n = 301;
  {
    // A clipped update equals the kernel run with the clipped scale.
    HostState a, b;
    a.fill(n, 5);
    b = a;
    core::QueuedUpdate u;
    u.config = variant.config;
    u.buffers = a.buffers(0, n);
    u.clip = core::GradClip{0.01, 1.0, 1.0};
    sapipe_update_result r{};
    double norm = -1;
    const sapipe_status s = core::run_queued_update(u, &r, &norm);
    double sq = 0;
    for (float g : b.g) sq += static_cast<double>(g) * g;
    double want_norm = 0;
    sapipe_update_config c = variant.config;
    c.grad_scale = core::clipped_grad_scale(*u.clip, sq, &want_norm);
    sapipe_update_buffers bb = b.buffers(0, n);
    sapipe_update_result rb{};
    sapipe_cpu_update(&c, &bb, &rb);
    t.expect(s == SAPIPE_OK && r.applied == 1 && std::fabs(norm - want_norm) <= 1e-9 * want_norm && a.w == b.w,
             "a clipped queued update is the kernel at the clipped scale");
  }
  {
    // A closed gate: nothing written, gate[0] reported as the non-finite count.
    HostState a;
    a.fill(n, 6);
    const HostState before = a;
    const float gate[2] = {3.0f, 0.0f};
    core::QueuedUpdate u;
    u.config = variant.config;
    u.buffers = a.buffers(0, n);
    u.gate = gate;
    sapipe_update_result r{1, -1};
    double norm = 0;
    t.expect(core::run_queued_update(u, &r, &norm) == SAPIPE_OK && r.applied == 0 && r.non_finite_count == 3 && a.w == before.w &&
                 a.m == before.m,
             "a gated update whose verdict is not all zeros writes nothing and reports the verdict's count");
    const float risk[2] = {0.0f, 1.0f};
    u.gate = risk;
    t.expect(core::run_queued_update(u, &r, &norm) == SAPIPE_OK && r.applied == 0 && a.w == before.w,
             "a gated update skips on an overflow risk too");
    const float open[2] = {0.0f, 0.0f};
    u.gate = open;
    t.expect(core::run_queued_update(u, &r, &norm) == SAPIPE_OK && r.applied == 1 && a.w != before.w, "an open gate lets the update run");
  }
  {
    // A latch signalled behind a failure: the update fails and writes nothing.
    HostState a;
    a.fill(n, 7);
    const HostState before = a;
    std::vector<float> latch(1, 0.0f);
    core::signal_latch(latch.data(), 0, true);
    core::QueuedUpdate u;
    u.config = variant.config;
    u.buffers = a.buffers(0, n);
    u.latch = latch.data();
    u.deadline = in(1s);
    sapipe_update_result r{};
    double norm = 0;
    t.expect(core::run_queued_update(u, &r, &norm) == SAPIPE_ERR_DISPOSED && a.w == before.w,
             "an update whose latch failed fails and writes nothing");
    latch[0] = 0.0f;
    u.deadline = in(1ms);
    t.expect(core::run_queued_update(u, &r, &norm) == SAPIPE_ERR_TIMEOUT && a.w == before.w, "an update whose latch never comes times out");
  }
  {
    std::vector<float> g(1000, 0.5f);
    float gate[2] = {-1, -1};
    t.expect(core::guard_verdict(g.data(), g.size(), 4, gate) == SAPIPE_OK && gate[0] == 0.0f && gate[1] == 0.0f,
             "the guard passes a small finite gradient");
    g[10] = NAN;
    g[999] = -INFINITY;
    t.expect(core::guard_verdict(g.data(), g.size(), 4, gate) == SAPIPE_OK && gate[0] == 2.0f && gate[1] == 0.0f,
             "the guard counts non-finite elements");
    std::vector<float> big(4, 1e37f);
    t.expect(core::guard_verdict(big.data(), big.size(), 1, gate) == SAPIPE_OK && gate[0] == 0.0f && gate[1] == 0.0f,
             "large finite elements one rank alone cannot overflow pass");
    t.expect(core::guard_verdict(big.data(), big.size(), 64, gate) == SAPIPE_OK && gate[0] == 0.0f && gate[1] == 1.0f,
             "large elements whose sum over the ranks could overflow are an overflow risk");
    std::vector<float> huge(4, 1e30f);  // finite, but their squares overflow the sum of squares
    huge[0] = 3e38f;
    t.expect(core::guard_verdict(huge.data(), huge.size(), 2, gate) == SAPIPE_OK && gate[0] == 0.0f && gate[1] == 1.0f,
             "finite elements whose squares overflow are a risk, not a skip");
  }
}

void check_thread_pools(Checks& t) {
  // Binding: the calling thread's kernels move to a pool of their own and back.
  t.expect(&ThreadPool::current() == &ThreadPool::global() && ThreadPool::bound() == nullptr, "thread pools: a thread starts on the global pool");
  t.expect(ThreadPool::bind_to_this_thread(3) == 3 && ThreadPool::current().size() == 3 && &ThreadPool::current() != &ThreadPool::global(), "thread pools: bound to 3 threads");
  t.expect(ThreadPool::bind_to_this_thread(1) == 1 && ThreadPool::current().size() == 1, "thread pools: bound to 1 thread");
  t.expect(ThreadPool::bind_to_this_thread(0) == ThreadPool::global().size() && &ThreadPool::current() == &ThreadPool::global(), "thread pools: unbound");

  // A product large enough to be split gives the same bits on every pool, and on two threads
  // computing at once, each on its own pool (the split is over C's rows; each element's sum runs
  // in one order).
  const size_t m = 257, n = 193, k = 311;
  std::vector<float> a(m * k), b(k * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 2654435761u) % 1000) / 500.0f - 1.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 40503u) % 777) / 388.0f - 1.0f;
  auto product = [&](std::vector<float>& c) {
    cpu::GemmArgs g;
    g.m = m, g.n = n, g.k = k, g.a = a.data(), g.lda = k, g.b = b.data(), g.ldb = n, g.c = c.data(), g.ldc = n;
    return cpu::sgemm(g);
  };
  std::vector<float> on_global(m * n);
  t.expect(product(on_global) == SAPIPE_OK, "thread pools: product on the global pool");
  std::vector<float> results[2] = {std::vector<float>(m * n), std::vector<float>(m * n)};
  sapipe_status statuses[2] = {SAPIPE_ERR_INTERNAL, SAPIPE_ERR_INTERNAL};
  int sizes[2] = {0, 0};
  {
    std::thread threads[2];
    for (int i = 0; i < 2; ++i)
      threads[i] = std::thread([&, i] {
        sizes[i] = ThreadPool::bind_to_this_thread(i + 1);
        for (int r = 0; r < 5 && (r == 0 || statuses[i] == SAPIPE_OK); ++r) statuses[i] = product(results[i]);
      });
    for (auto& th : threads) th.join();
  }
  for (int i = 0; i < 2; ++i) {
    t.expect(sizes[i] == i + 1 && statuses[i] == SAPIPE_OK, "thread pools: a product on a thread's own pool of " + std::to_string(i + 1));
    t.expect(results[i] == on_global, "thread pools: the same bits on a pool of " + std::to_string(i + 1) + " as on the global pool");
  }

  // A queue runs a task on its submitter's pool, which the task keeps alive after the submitter
  // rebinds; a task submitted by an unbound thread runs on the global pool.
  {
    ExecutionQueue q;
    std::promise<void> go;
    std::shared_future<void> started = go.get_future().share();
    ThreadPool::bind_to_this_thread(3);
    ThreadPool* submitter_pool = ThreadPool::bound().get();
    std::atomic<ThreadPool*> seen{nullptr};
    std::atomic<int> seen_size{0};
    std::vector<float> queued(m * n);
    std::atomic<int> queued_status{SAPIPE_ERR_INTERNAL};
    q.submit([&, started](bool) {
      started.wait();
      seen = &ThreadPool::current();
      seen_size = ThreadPool::current().size();
      queued_status = product(queued);
      return false;
    });
    ThreadPool::bind_to_this_thread(0);  // the submitter lets go of its pool while the task waits
    std::atomic<ThreadPool*> unbound_seen{nullptr};
    q.submit([&](bool) {
      unbound_seen = &ThreadPool::current();
      return false;
    });
    go.set_value();
    std::promise<void> done;
    std::atomic<bool> queue_thread_unbound{false};
    q.submit([&](bool) {
      queue_thread_unbound = ThreadPool::bound() == nullptr;
      done.set_value();
      return false;
    });
    done.get_future().wait();
    t.expect(seen.load() == submitter_pool && seen_size.load() == 3, "thread pools: a queued task runs on its submitter's pool");
    t.expect(queued_status.load() == SAPIPE_OK && queued == on_global, "thread pools: the pool outlives its thread's binding while a task holds it");
    t.expect(unbound_seen.load() == &ThreadPool::global(), "thread pools: a task from an unbound thread runs on the global pool");
    t.expect(queue_thread_unbound.load(), "thread pools: a queued task leaves the queue thread's binding as it was");
  }
}

}  // namespace sapipe::tests
