#include "aligned_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace sapipe {

std::shared_ptr<AlignedBuffer> AlignedBuffer::allocate(size_t elements) {
  // Round up to whole cache lines; keep at least one line so data() is never null for live buffers.
  size_t bytes = elements * sizeof(float);
  if (elements != 0 && bytes / sizeof(float) != elements) return nullptr;
  bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (bytes == 0) bytes = kAlignment;
  void* memory = std::aligned_alloc(kAlignment, bytes);
  if (memory == nullptr) return nullptr;
  std::memset(memory, 0, bytes);
  auto* buffer = new (std::nothrow) AlignedBuffer(static_cast<float*>(memory), elements);
  if (buffer == nullptr) std::free(memory);
  return std::shared_ptr<AlignedBuffer>(buffer);
}

std::shared_ptr<AlignedBuffer> AlignedBuffer::adopt(float* data, size_t elements, Release release) {
  auto* buffer = new (std::nothrow) AlignedBuffer(data, elements, std::move(release));
  if (buffer == nullptr) return nullptr;  // the caller still owns data
  return std::shared_ptr<AlignedBuffer>(buffer);
}

AlignedBuffer::~AlignedBuffer() { free_storage(); }

void AlignedBuffer::free_storage() {
  if (data_ == nullptr) return;
  if (release_)
    release_(data_);
  else
    std::free(data_);
  data_ = nullptr;
}

}  // namespace sapipe
