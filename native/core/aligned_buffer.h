// Host memory for tensors: 64-byte aligned (one cache line, one AVX-512 vector), zero-filled,
// owned through shared_ptr so that an operation still queued keeps its buffers alive.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>

namespace sapipe {

class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 64;

  // Returns nullptr when the allocation fails.
  static std::shared_ptr<AlignedBuffer> allocate(size_t elements);
  // Memory allocated elsewhere (e.g. a communicator's shared memory), 64-byte aligned and zeroed
  // by its allocator; `release` frees it, once, from whichever thread drops the buffer last.
  using Release = std::function<void(float*)>;
  static std::shared_ptr<AlignedBuffer> adopt(float* data, size_t elements, Release release);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  float* data() const { return data_; }
  size_t size() const { return size_; }
  bool disposed() const { return data_ == nullptr; }

  // Operations in flight on a queue hold the buffer busy so dispose() cannot free it under them
  // and synchronous operations do not touch it meanwhile.
  void acquire() { in_flight_.fetch_add(1, std::memory_order_acq_rel); }
  void release() { in_flight_.fetch_sub(1, std::memory_order_acq_rel); }
  bool busy() const { return in_flight_.load(std::memory_order_acquire) != 0; }
  // An operation in flight that only reads the buffer (an out-of-place update's input weights,
  // which a forward pass reads meanwhile): synchronous reads stay allowed, writes and dispose() not.
  void acquire_read() { readers_.fetch_add(1, std::memory_order_acq_rel); }
  void release_read() { readers_.fetch_sub(1, std::memory_order_acq_rel); }
  // Anything in flight: what dispose() and writing operations check.
  bool in_use() const { return busy() || readers_.load(std::memory_order_acquire) != 0; }

  // Frees the memory now. The caller has detached every JS view and checked in_use().
  void free_storage();

 private:
  AlignedBuffer(float* data, size_t size, Release release = {}) : data_(data), size_(size), release_(std::move(release)) {}
  float* data_;
  size_t size_;
  Release release_;  // empty: data_ came from std::aligned_alloc
  std::atomic<int> in_flight_{0};
  std::atomic<int> readers_{0};
};

}  // namespace sapipe
