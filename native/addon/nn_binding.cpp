// The matrix product behind lib/nn: sgemm({ transA, transB, m, n, k, alpha, beta, a, aOffset, b,
// bOffset, c, cOffset }). Matrices are dense row-major views into NativeBuffers starting at the
// given element offsets (a ParamSet tensor, an activation buffer), so a layer costs one call and
// no copy. Every view is checked against its buffer here; the kernel checks again.
#include <algorithm>
#include <chrono>
#include <string>

#include "../cpu/gemm.h"
#include "errors.h"
#include "js_args.h"
#include "native_buffer.h"
#include "nn_binding.h"

namespace sapipe::addon {
namespace {

using BufferPtr = std::shared_ptr<AlignedBuffer>;

struct MatrixView {
  BufferPtr buffer;
  size_t offset;
};

MatrixView get_matrix(const Napi::Object& o, const char* key, const char* offset_key, size_t rows, size_t cols) {
  Napi::Env env = o.Env();
  MatrixView v{NativeBuffer::FromValue(env, o.Get(key), key), get_index(o, offset_key, 0)};
  if (v.buffer->busy())
    throw_error(env, "ERR_BUSY", std::string("sgemm: ") + key + " is in use by a pending asynchronous operation; await it first");
  const size_t need = rows * cols;
  if (v.offset > v.buffer->size() || v.buffer->size() - v.offset < need)
    throw_error(env, "ERR_SIZE_MISMATCH",
                std::string("sgemm: ") + key + " needs " + std::to_string(rows) + " x " + std::to_string(cols) +
                    " elements from offset " + std::to_string(v.offset) + ", but its buffer has " +
                    std::to_string(v.buffer->size()));
  return v;
}

Napi::Value Sgemm(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = expect_object(env, info[0], "sgemm options");
  cpu::GemmArgs g;
  g.trans_a = get_bool(o, "transA", false);
  g.trans_b = get_bool(o, "transB", false);
  g.m = get_index(o, "m", 0);
  g.n = get_index(o, "n", 0);
  g.k = get_index(o, "k", 0);
  // Dimensions above 2^31 would overflow the element counts below long before memory runs out.
  constexpr size_t kMaxDim = size_t{1} << 31;
  if (g.m > kMaxDim || g.n > kMaxDim || g.k > kMaxDim)
    throw_error(env, "ERR_INVALID_ARGUMENT", "sgemm: m, n and k must be at most 2^31");
  g.alpha = static_cast<float>(get_number(o, "alpha", 1.0));
  g.beta = static_cast<float>(get_number(o, "beta", 0.0));
  MatrixView a = get_matrix(o, "a", "aOffset", g.m, g.k);
  MatrixView b = get_matrix(o, "b", "bOffset", g.k, g.n);
  MatrixView c = get_matrix(o, "c", "cOffset", g.m, g.n);
  g.a = a.buffer->data() + a.offset;
  g.lda = g.trans_a ? g.m : g.k;
  g.b = b.buffer->data() + b.offset;
  g.ldb = g.trans_b ? g.k : g.n;
  g.c = c.buffer->data() + c.offset;
  g.ldc = g.n;
  sapipe_status status = cpu::sgemm(g);
  if (status != SAPIPE_OK) throw_status(env, status, "sgemm (C must not overlap A or B; alpha and beta must be finite)");
  return env.Undefined();
}

// The core clock in GHz, for the peak FLOP/s that `sapipe bench gemm` compares against: a chain
// of dependent integer multiplies (3 cycles each on every x86-64 core since Nehalem) timed for
// about 20 ms. /proc/cpuinfo reports the nominal clock on virtual machines, not the turbo clock
// the kernels run at. Returns 0 where it cannot measure (not x86-64).
Napi::Value MeasureClockGhz(const Napi::CallbackInfo& info) {
  double ghz = 0.0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  constexpr long kIterations = 1 << 21;  // 4 multiplies each
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    unsigned long x = 3;
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < kIterations; ++i)
      __asm__ volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > 0) best = std::max(best, 12.0 * kIterations / seconds / 1e9);
  }
  ghz = best;
#endif
  return Napi::Number::New(info.Env(), ghz);
}

}  // namespace

void InitNn(Napi::Env env, Napi::Object exports) {
  exports.Set("sgemm", Napi::Function::New(env, Sgemm, "sgemm"));
  exports.Set("measureClockGhz", Napi::Function::New(env, MeasureClockGhz, "measureClockGhz"));
}

}  // namespace sapipe::addon
