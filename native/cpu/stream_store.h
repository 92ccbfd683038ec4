// Non-temporal stores for write-only outputs (the predicted weights). A normal store first reads
// the line it writes (read-for-ownership), so a write-only stream costs twice its bytes; streaming
// stores skip that read. They also bypass the cache, so they are only used when the output is far
// larger than the caches (see kStreamThreshold in cpu_api.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define SAPIPE_HAVE_STREAM_STORE 1
#endif

#include "inline.h"

namespace sapipe::cpu {

SAPIPE_KERNEL_BODY void stream_store(float* dst, const float* __restrict src, size_t len) {
  size_t i = 0;
#ifdef SAPIPE_HAVE_STREAM_STORE
  for (; i < len && (reinterpret_cast<uintptr_t>(dst + i) & 15) != 0; ++i) dst[i] = src[i];
  for (; i + 4 <= len; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
#endif
  for (; i < len; ++i) dst[i] = src[i];
}

// Orders streaming stores before whatever the thread does next (the pool's completion signal).
SAPIPE_KERNEL_BODY void stream_fence() {
#ifdef SAPIPE_HAVE_STREAM_STORE
  _mm_sfence();
#endif
}

}  // namespace sapipe::cpu
