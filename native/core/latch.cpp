#include "latch.h"

#include <condition_variable>
#include <mutex>

namespace sapipe::core {
namespace {

std::mutex latch_mutex;
std::condition_variable latch_signalled;

void set_latch(float* latch, size_t slot, float value) {
  {
    std::lock_guard<std::mutex> lock(latch_mutex);
    latch[slot] = value;
  }
  latch_signalled.notify_all();
}

}  // namespace

sapipe_status wait_for_latch(const float* latch, size_t slot, LatchClock::time_point deadline) {
  std::unique_lock<std::mutex> lock(latch_mutex);
  if (!latch_signalled.wait_until(lock, deadline, [&] { return latch[slot] != 0.0f; })) return SAPIPE_ERR_TIMEOUT;
  return latch[slot] > 0.0f ? SAPIPE_OK : SAPIPE_ERR_DISPOSED;
}

void signal_latch(float* latch, size_t slot, bool previous_failed) {
  bool earlier_failed;
  {
    std::lock_guard<std::mutex> lock(latch_mutex);
    earlier_failed = slot > 0 && latch[slot - 1] < 0.0f;
  }
  set_latch(latch, slot, previous_failed || earlier_failed ? -1.0f : 1.0f);
}

void drop_latch_signal(float* latch, size_t slot) { set_latch(latch, slot, -1.0f); }

}  // namespace sapipe::core
