#include "aligned_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace sapipe {

namespace {
// From this size on, memory comes straight from mmap: page aligned, zero without a memset pass
// (pages are zeroed as they are first touched, so a model's allocation does not wait for it), and
// returned to the system at once when freed. Without MAP_NORESERVE the kernel's overcommit check
// still refuses a request far beyond the machine's memory, which becomes ERR_OUT_OF_MEMORY.
constexpr size_t kMapThresholdBytes = size_t{1} << 20;
}  // namespace

std::shared_ptr<AlignedBuffer> AlignedBuffer::allocate(size_t elements) {
  // Round up to whole cache lines; keep at least one line so data() is never null for live buffers.
  if (elements > (SIZE_MAX - kAlignment) / sizeof(float)) return nullptr;
  size_t bytes = elements * sizeof(float);
  bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (bytes == 0) bytes = kAlignment;
  if (bytes >= kMapThresholdBytes) {
    void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) return nullptr;
    // Transparent huge pages where the system offers them on request: first-touch faults (the first
    // step over a fresh model) and TLB misses drop by 512x. Advice only: failure changes nothing.
    madvise(mapped, bytes, MADV_HUGEPAGE);
    auto buffer = adopt(static_cast<float*>(mapped), elements, [bytes](float* p) { munmap(p, bytes); });
    if (!buffer) munmap(mapped, bytes);
    return buffer;
  }
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
