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
  return std::shared_ptr<AlignedBuffer>(new (std::nothrow) AlignedBuffer(static_cast<float*>(memory), elements));
}

AlignedBuffer::~AlignedBuffer() { free_storage(); }

void AlignedBuffer::free_storage() {
  std::free(data_);
  data_ = nullptr;
}

}  // namespace sapipe
