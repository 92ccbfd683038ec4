// Runs without Node and without a GPU: every CPU kernel against the scalar reference on random
// data (odd sizes for the vector tails, offsets, several steps), the non-finite guard, and the
// failure paths of the plugin and NCCL loaders against the fake libraries CMake builds beside it,
// what the addon queues (schedule_check.cpp), the communication backends' operations
// (comm_check.cpp), and the CUDA plugin's reports and device memory over fake plugins
// (device_check.cpp).
// test/native/cpu-harness.test.ts runs it; usage: sapipe_cpu_check [--fakes DIR]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../core/aligned_buffer.h"
#include "../core/cpu_clock.h"
#include "../core/host_kernels.h"
#include "../core/plugin_loader.h"
#include "../core/device/cublas_loader.h"
#include "../core/device/cuda_plugin.h"
#include "../core/device/nccl_loader.h"
#include "../cpu/nn_elementwise.h"
#include "check.h"
#include "comm_check.h"
#include "device_check.h"
#include "reference_check.h"
#include "sapipe/kernels.h"
#include "sapipe/nn.h"
#include "schedule_check.h"
#include "scalar_reference.h"
#include "variants.h"

using namespace sapipe;
using namespace sapipe::tests;

namespace {

// Sizes with vector tails, for the helpers.
const size_t kSizes[] = {1, 3, 17, 1000, 4099};

void check_variants(Checks& t) {
  check_variants_against_reference(
      t,
      [](const sapipe_update_config& c, HostState& s, size_t offset, size_t n) {
        sapipe_update_buffers b = s.buffers(offset, n);
        sapipe_update_result result{};
        return sapipe_cpu_update(&c, &b, &result) == SAPIPE_OK && result.applied == 1;
      },
      3);
}

void check_guard(Checks& t) {
  for (const Variant& variant : update_variants()) {
    HostState s;
    s.fill(257, 7);
    const bool reads_local = variant.config.prediction == SAPIPE_PREDICTION_SHADOW_STEP &&
                             variant.config.estimate != SAPIPE_ESTIMATE_PREV_SYNC;
    (reads_local ? s.local : s.g)[200] = NAN;
    s.g[13] = INFINITY;
    const HostState before = s;
    sapipe_update_config c = variant.config;
    sapipe_update_buffers b = s.buffers(0, 257);
    sapipe_update_result r{};
    const sapipe_status st = sapipe_cpu_update(&c, &b, &r);
    t.expect(st == SAPIPE_OK && r.applied == 0 && r.non_finite_count == (reads_local ? 2 : 2),
             variant.name + ": the guard skips a step with non-finite gradients and counts them");
    t.expect(s.w == before.w && s.m == before.m && s.v == before.v && s.backup == before.backup &&
                 s.predicted == before.predicted && s.prev_local == before.prev_local,
             variant.name + ": a skipped step writes nothing");
  }
}

// Out of place (weights_in): the same step as in place, bit for bit, with the input weights left
// as they were; weights_in overlapping any buffer the step writes is refused.
void check_out_of_place(Checks& t) {
  for (const Variant& variant : update_variants()) {
    for (size_t n : {size_t{1}, size_t{1001}, size_t{4099}}) {
      HostState in_place;
      in_place.fill(n, 11);
      HostState out = in_place;
      const std::vector<float> w_old = in_place.w;
      std::vector<float> source = in_place.w;
      std::fill(out.w.begin(), out.w.end(), 123.0f);  // stale contents of the output buffer
      for (int step = 1; step <= 3; ++step) {
        sapipe_update_config c = variant.config;
        c.step = step;
        c.have_prev_local = step > 1;
        c.momentum_is_empty = step == 1 && c.momentum_is_empty;
        sapipe_update_buffers a = in_place.buffers(0, n), b = out.buffers(0, n);
        b.weights_in = source.data();
        sapipe_update_result ra{}, rb{};
        const bool ok = sapipe_cpu_update(&c, &a, &ra) == SAPIPE_OK && sapipe_cpu_update(&c, &b, &rb) == SAPIPE_OK;
        t.expect(ok && ra.applied == 1 && rb.applied == 1, variant.name + ": out-of-place step runs");
        t.expect(out.w == in_place.w && out.m == in_place.m && out.v == in_place.v && out.backup == in_place.backup &&
                     out.predicted == in_place.predicted && out.prev_local == in_place.prev_local,
                 variant.name + " n=" + std::to_string(n) + ": out of place equals in place, bit for bit");
        if (step == 1) t.expect(source == w_old, variant.name + ": the input weights are only read");
        source = out.w;  // the next step reads this step's output, as the trainer's double buffer does
        std::fill(out.w.begin(), out.w.end(), -7.0f);
      }
    }
  }
  HostState s;
  s.fill(64, 3);
  sapipe_update_config c = update_variants()[0].config;
  sapipe_update_buffers b = s.buffers(0, 64);
  b.weights_in = s.w.data() + 8;
  sapipe_update_result r{};
  t.expect(sapipe_cpu_update(&c, &b, &r) == SAPIPE_ERR_ALIASING, "weights_in overlapping the weights is refused");
}

void check_helpers(Checks& t) {
  for (size_t n : kSizes) {
    HostState s;
    s.fill(n, static_cast<unsigned>(n));
    for (size_t k = 1; k <= 10; k += 3) {
      std::vector<std::vector<float>> in(k, s.g);
      for (size_t j = 0; j < k; ++j)
        for (size_t i = 0; i < n; ++i) in[j][i] += static_cast<float>(j) * 0.125f;
      if (n > 2 && k > 1) in[k - 1][1] = NAN;
      std::vector<const float*> ptrs;
      for (auto& x : in) ptrs.push_back(x.data());
      std::vector<float> out(n), want(n);
      int64_t bad = -1, want_bad = 0;
      for (size_t i = 0; i < n; ++i) {
        double acc = 0;
        for (size_t j = 0; j < k; ++j) acc += in[j][i];
        want[i] = static_cast<float>(acc * 0.5);
        want_bad += !std::isfinite(want[i]);
      }
      t.expect(sapipe_cpu_sum(out.data(), ptrs.data(), k, n, 0.5f, &bad) == SAPIPE_OK && bad == want_bad,
               "sum of " + std::to_string(k) + " counts non-finite results (n=" + std::to_string(n) + ")");
      auto finite_part = [](std::vector<float> x) {
        for (float& e : x) if (!std::isfinite(e)) e = 0;
        return x;
      };
      t.expect(worst_error(finite_part(out), finite_part(want), 1e-6, 1e-6) <= 1.0, "sum values n=" + std::to_string(n));
    }
    std::vector<float> x = s.w, y = s.m, want_x = s.w, want_y = s.m;
    sapipe_cpu_scale(x.data(), n, 3.0f);
    for (float& e : want_x) e *= 3.0f;
    t.expect(x == want_x, "scale n=" + std::to_string(n));
    sapipe_cpu_axpy(y.data(), s.w.data(), n, -2.0f);
    for (size_t i = 0; i < n; ++i) want_y[i] = static_cast<float>(static_cast<double>(s.m[i]) - 2.0 * s.w[i]);
    t.expect(worst_error(y, want_y, 1e-6, 1e-7) <= 1.0, "axpy n=" + std::to_string(n));
    double norm = 0, want_norm = 0;
    for (float e : s.w) want_norm += static_cast<double>(e) * e;
    t.expect(sapipe_cpu_squared_norm(s.w.data(), n, &norm) == SAPIPE_OK && std::fabs(norm - want_norm) <= 1e-6 * want_norm,
             "squared norm n=" + std::to_string(n));
    std::vector<float> worker = s.w, center = s.backup;
    sapipe_cpu_elastic_average(worker.data(), center.data(), n, 0.3f);
    std::vector<float> want_w(n), want_c(n);
    for (size_t i = 0; i < n; ++i) {
      const double d = 0.3 * (static_cast<double>(s.w[i]) - s.backup[i]);
      want_w[i] = static_cast<float>(s.w[i] - d), want_c[i] = static_cast<float>(s.backup[i] + d);
    }
    t.expect(worst_error(worker, want_w, 1e-6, 1e-7) <= 1.0 && worst_error(center, want_c, 1e-6, 1e-7) <= 1.0,
             "elastic average n=" + std::to_string(n));
    std::vector<float> bad = s.g;
    bad[0] = NAN;
    if (n > 2) bad[n - 1] = -INFINITY;
    int64_t count = -1;
    t.expect(sapipe_cpu_count_non_finite(bad.data(), n, &count) == SAPIPE_OK && count == (n > 2 ? 2 : 1),
             "count non-finite n=" + std::to_string(n));
  }
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Choosing among the CUDA plugins (sapipe_cuda.so for CUDA 13, sapipe_cuda11.so for CUDA 11.8):
// the first whose devices can run its code is taken, in order. Fakes stand in for both: the
// host-memory plugin has a device that can run it, device_without_code is the CUDA 13 plugin on a
// V100, without_device finds no device.
void check_cuda_plugin_choice(Checks& t, const std::string& fakes) {
  const std::string usable = fakes + "/sapipe_test_plugin_host_memory.so";
  const std::string no_code = fakes + "/sapipe_test_plugin_device_without_code.so";
  const std::string no_device = fakes + "/sapipe_test_plugin_without_device.so";
  const std::string other_abi = fakes + "/sapipe_test_plugin_other_abi.so";
  const std::string missing = fakes + "/no-such-plugin.so";

  PluginLoad first = choose_cuda_plugin({usable, no_code}, "test", "");
  t.expect(first.table && first.path == usable && contains(first.choice, "a visible device can run its code") &&
               !contains(first.choice, "passed over") && first.candidates_reason.empty(),
           "the first plugin whose device can run it is taken: " + first.choice);

  PluginLoad fallback = choose_cuda_plugin({no_code, usable}, "test", "");
  t.expect(fallback.table && fallback.path == usable && contains(fallback.choice, "passed over " + no_code) &&
               contains(fallback.choice, "no visible device can run this plugin's code") && contains(fallback.choice, "CUDA 13.0") &&
               fallback.candidates_reason.empty(),
           "a plugin without code for the device (a V100 under CUDA 13) is passed over for the next: " + fallback.choice);

  PluginLoad neither = choose_cuda_plugin({no_code, no_device}, "test", "");
  t.expect(neither.table && neither.path == no_code && contains(neither.candidates_reason, no_code) &&
               contains(neither.candidates_reason, no_device) && contains(neither.candidates_reason, "no visible device can run") &&
               contains(neither.candidates_reason, "no CUDA device is visible") && contains(neither.choice, "none can run here"),
           "when no plugin can run, the first that loaded is kept and every reason is given: " + neither.candidates_reason);

  PluginLoad broken_first = choose_cuda_plugin({other_abi, no_code}, "test", "");
  t.expect(broken_first.table && broken_first.path == no_code && contains(broken_first.candidates_reason, "ABI version") &&
               contains(broken_first.candidates_reason, "no visible device can run"),
           "a candidate that does not load is passed over with its reason: " + broken_first.candidates_reason);

  PluginLoad only = choose_cuda_plugin({missing, usable}, "test", "");
  t.expect(only.table && only.path == usable && contains(only.choice, "the only CUDA plugin present"),
           "a single plugin present is taken without asking for devices: " + only.choice);

  PluginLoad none = choose_cuda_plugin({missing, fakes + "/no-such-plugin-11.so"}, "test", " (hint)");
  t.expect(!none.table && contains(none.reason, "not found") && contains(none.reason, missing) &&
               contains(none.reason, "no-such-plugin-11.so") && contains(none.reason, "(hint)"),
           "no plugin present names every file looked for: " + none.reason);
}

// fn(&reason) run in a forked child, its status and reason sent back through a pipe; the child
// leaves with _exit, so whatever it loaded stays out of this process and its exit checks.
template <class F>
sapipe_status in_child(F fn, std::string* reason) {
  int fds[2];
  if (pipe(fds) != 0) return fn(reason);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return fn(reason);
  }
  if (pid == 0) {
    close(fds[0]);
    std::string why;
    const int32_t status = fn(&why);
    std::string out(reinterpret_cast<const char*>(&status), sizeof status);
    out += why;
    for (size_t at = 0; at < out.size();) {
      const ssize_t n = write(fds[1], out.data() + at, out.size() - at);
      if (n <= 0) break;
      at += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string in;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) in.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  if (in.size() < sizeof(int32_t)) {
    *reason = "the child process that tried the library failed";
    return SAPIPE_ERR_INTERNAL;
  }
  int32_t status = 0;
  std::memcpy(&status, in.data(), sizeof status);
  *reason = in.substr(sizeof status);
  return static_cast<sapipe_status>(status);
}

void check_loaders(Checks& t, const std::string& fakes) {
  const size_t size = sizeof(sapipe_cuda_plugin_v1);
  PluginLoad missing = load_plugin(fakes + "/no-such-plugin.so", "cuda", SAPIPE_CUDA_PLUGIN_ABI_VERSION, size);
  t.expect(!missing.table && contains(missing.reason, "not found") && contains(missing.reason, "no-such-plugin.so"),
           "a missing plugin names the file looked for: " + missing.reason);
  PluginLoad no_entry = load_plugin(fakes + "/sapipe_test_plugin_without_entry.so", "cuda", SAPIPE_CUDA_PLUGIN_ABI_VERSION, size);
  t.expect(!no_entry.table && contains(no_entry.reason, "sapipe_plugin_entry"),
           "a plugin without its entry point names the symbol: " + no_entry.reason);
  PluginLoad other = load_plugin(fakes + "/sapipe_test_plugin_other_abi.so", "cuda", SAPIPE_CUDA_PLUGIN_ABI_VERSION, size);
  t.expect(!other.table && contains(other.reason, "ABI version " + std::to_string(SAPIPE_CUDA_PLUGIN_ABI_VERSION)) && contains(other.reason, "999"),
           "a plugin of another ABI version is refused: " + other.reason);
  PluginLoad no_device = load_plugin(fakes + "/sapipe_test_plugin_without_device.so", "cuda", SAPIPE_CUDA_PLUGIN_ABI_VERSION, size);
  t.expect(no_device.table != nullptr, "a complete table loads: " + no_device.reason);
  if (no_device.table) {
    auto cuda = reinterpret_cast<const sapipe_cuda_plugin_v1*>(no_device.table);
    int32_t n = -1;
    t.expect(cuda->device_count(&n) == SAPIPE_ERR_BACKEND_UNAVAILABLE && n == 0 && contains(cuda->last_error(), "no CUDA device"),
             "no device is reported as unavailable with the reason");
  }
  PluginLoad wrong_name = load_plugin(fakes + "/sapipe_test_plugin_without_device.so", "ucx", SAPIPE_CUDA_PLUGIN_ABI_VERSION, size);
  t.expect(!wrong_name.table && contains(wrong_name.reason, "not the ucx plugin"), "a plugin of another kind is refused");

  nccl::Api api{};
  std::string reason;
  const std::string nowhere = fakes + "/no-nccl-here";
  // Only meaningful where the system has no NCCL of its own.
  sapipe_status s = nccl::load_uncached(nowhere.c_str(), &api, &reason);
  if (s != SAPIPE_OK) {
    t.expect(s == SAPIPE_ERR_BACKEND_UNAVAILABLE && contains(reason, "libnccl.so.2") && contains(reason, nowhere) &&
                 contains(reason, "SAPIPE_NCCL_PATH"),
             "a missing NCCL names every place looked at: " + reason);
  }
  reason.clear();
  const std::string fake_nccl = fakes + "/nccl-without-allreduce";
  s = nccl::load_uncached(fake_nccl.c_str(), &api, &reason);
  t.expect(s == SAPIPE_ERR_BACKEND_UNAVAILABLE && contains(reason, "ncclAllReduce") && contains(reason, fake_nccl),
           "an NCCL without ncclAllReduce names the symbol and the file: " + reason);

  // cuBLAS, opened the same way by the CUDA plugin's model operations.
  cublas::Api blas{};
  reason.clear();
  const std::string no_blas = fakes + "/no-cublas-here";
  // Only meaningful where the system has no cuBLAS of its own (as on a machine without CUDA).
  // Tried in a child process: a system cuBLAS, where there is one, opens and closes the driver
  // library (libcuda.so.1) as it loads, which leaves allocations of an unloaded module that
  // LeakSanitizer reports against this process in the sanitizer build.
  s = in_child([&](std::string* why) { return cublas::load_uncached(no_blas.c_str(), 13, &blas, why); }, &reason);
  if (s != SAPIPE_OK) {
    t.expect(s == SAPIPE_ERR_BACKEND_UNAVAILABLE && contains(reason, no_blas + "/libcublas.so.13") && contains(reason, "libcublas.so.11") &&
                 contains(reason, "SAPIPE_CUBLAS_PATH") && contains(reason, "Install cuBLAS"),
             "a missing cuBLAS names every place looked at and what to install: " + reason);
  }
  // A library that is no cuBLAS, named as a file: found first, and refused for its missing symbol.
  reason.clear();
  const std::string not_blas = fake_nccl + "/libnccl.so.2";
  s = cublas::load_uncached(not_blas.c_str(), 13, &blas, &reason);
  t.expect(s == SAPIPE_ERR_BACKEND_UNAVAILABLE && contains(reason, "cublasCreate_v2") && contains(reason, not_blas),
           "a library without cublasCreate_v2 names the symbol and the file: " + reason);
}

std::string self_directory() {
  char buf[4096];
  const ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (len <= 0) return ".";
  std::string path(buf, static_cast<size_t>(len));
  return path.substr(0, path.rfind('/'));
}

}  // namespace

// Host buffers: small ones from aligned_alloc, large ones mapped; both 64-byte aligned, zeroed,
// freed once (the sanitizer build would report a double free or a leak), and a size that cannot be
// held is a null result, not an abort.
void check_buffers(Checks& t) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1} << 18, (size_t{1} << 20) + 3}) {
    auto buffer = AlignedBuffer::allocate(n);
    t.expect(buffer != nullptr, "buffer of " + std::to_string(n) + " floats allocates");
    if (!buffer) continue;
    t.expect(reinterpret_cast<uintptr_t>(buffer->data()) % AlignedBuffer::kAlignment == 0, "buffer is 64-byte aligned");
    bool zero = true;
    for (size_t i = 0; i < n; ++i) zero = zero && buffer->data()[i] == 0.0f;
    t.expect(zero, "buffer of " + std::to_string(n) + " floats starts zeroed");
    if (n > 0) buffer->data()[n - 1] = 1.0f;  // the last element is writable
    buffer->free_storage();
    t.expect(buffer->disposed(), "free_storage() frees");
    buffer->free_storage();  // a second call is a no-op, and the destructor frees nothing more
  }
  t.expect(AlignedBuffer::allocate(SIZE_MAX / 2) == nullptr, "an impossible size gives nullptr");
  t.expect(AlignedBuffer::allocate(SIZE_MAX / sizeof(float)) == nullptr, "a size whose byte count overflows gives nullptr");
}

// The measured clock: positive and below any real core clock where it can be measured (x86-64;
// no lower bound beyond that, as a loaded machine measures less), else 0.
void check_cpu_clock(Checks& t) {
  const double ghz = measure_cpu_clock_ghz();
#if defined(__x86_64__)
  t.expect(ghz > 0.0 && ghz < 20.0, "the measured core clock is plausible: " + std::to_string(ghz) + " GHz");
#else
  t.expect(ghz == 0.0, "the core clock is not measured off x86-64");
#endif
}

// What info() reports of the instruction sets: the active one is never above what the CPU supports.
void check_simd_names(Checks& t) {
  auto rank = [](const std::string& name) { return name == "baseline" ? 0 : name == "avx2" ? 1 : name == "avx512" ? 2 : -1; };
  const std::string active = core::host_kernels_simd(), supported = core::host_simd_supported();
  t.expect(rank(active) >= 0 && rank(supported) >= rank(active), "the host kernels run " + active + ", the CPU supports " + supported);
}

// The model operations' vectorised element loops (nn_elementwise.h) at every instruction set the
// CPU has: the exp against libm's in double, over the whole float range and the special values;
// exp_shifted's sum; GELU and its gradient against the formula in double; odd lengths, so every
// vector tail runs.
void check_nn_elementwise(Checks& t) {
  const int best = static_cast<int>(cpu::best_supported_simd());
  for (int level = 0; level <= best; ++level) {
    const cpu::SimdLevel simd = static_cast<cpu::SimdLevel>(level);
    const cpu::NnElementKernels& k = cpu::nn_element_kernels(simd);
    const std::string name = cpu::simd_name(simd);
    const size_t n = 20011;  // -100 to 10 in steps of 0.0055, and not a multiple of 16
    std::vector<float> x(n), e(n);
    for (size_t i = 0; i < n; ++i) x[i] = -100.0f + 0.0055f * static_cast<float>(i);
    const float sum = k.exp_shifted(e.data(), x.data(), n, 0.0f);
    double worst = 0.0, want_sum = 0.0;
    bool below_is_zero = true;
    for (size_t i = 0; i < n; ++i) {
      const double want = std::exp(static_cast<double>(x[i]));
      want_sum += want;
      if (x[i] < -87.33654f) below_is_zero = below_is_zero && e[i] == 0.0f;
      else worst = std::fmax(worst, std::fabs(e[i] - want) / want);
    }
    t.expect(worst <= 3e-7, name + ": exp within 3e-7 relative (2.5 float ulp) of the exact value over [-87.3, 10] (worst " +
                                std::to_string(worst) + ")");
    t.expect(below_is_zero, name + ": exp below ln(FLT_MIN) is 0");
    t.expect(std::fabs(sum - want_sum) <= 1e-6 * want_sum, name + ": exp_shifted's sum within 1e-6 relative");
    const float special[] = {0.0f, -0.0f, -INFINITY, NAN, 88.0f, 88.5f, INFINITY, -87.0f, 1e-30f};
    float got[9];
    k.exp_shifted(got, special, 9, 0.0f);
    t.expect(got[0] == 1.0f && got[1] == 1.0f && got[2] == 0.0f && std::isnan(got[3]) && std::isfinite(got[4]) && std::isinf(got[5]) &&
                 std::isinf(got[6]) && got[7] > 0.0f && got[8] == 1.0f,
             name + ": exp(0) = 1, exp(-inf) = 0, exp(NaN) = NaN, exp(88) finite, infinity above");
    float shifted[3];
    const float in3[3] = {5.0f, 4.0f, 3.0f};
    const float s3 = k.exp_shifted(shifted, in3, 3, 5.0f);
    t.expect(shifted[0] == 1.0f && std::fabs(s3 - (1.0f + std::exp(-1.0f) + std::exp(-2.0f))) < 1e-6f, name + ": exp_shifted subtracts the shift");

    std::vector<float> gx(1001), gy(1001), gdy(1001), gdx(1001);
    for (size_t i = 0; i < gx.size(); ++i) gx[i] = -12.0f + 0.024f * static_cast<float>(i), gdy[i] = 0.5f + 0.001f * static_cast<float>(i);
    k.gelu(gy.data(), gx.data(), gx.size());
    k.gelu_backward(gdx.data(), gx.data(), gdy.data(), gx.size());
    double gworst = 0.0;
    for (size_t i = 0; i < gx.size(); ++i) {
      const double v = gx[i], u = 0.7978845608028654 * (v + 0.044715 * v * v * v), th = std::tanh(u);
      const double y = 0.5 * v * (1.0 + th);
      const double dy = gdy[i] * (0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v));
      gworst = std::fmax(gworst, std::fabs(gy[i] - y) / (1e-7 + 1e-6 * std::fabs(y)));
      gworst = std::fmax(gworst, std::fabs(gdx[i] - dy) / (1e-7 + 1e-6 * std::fabs(dy)));
    }
    t.expect(gworst <= 1.0, name + ": GELU and its gradient within 1e-7 + 1e-6 relative of the formula in double (worst " +
                                 std::to_string(gworst) + " of it)");
    const float gspecial[3] = {INFINITY, -INFINITY, NAN};
    float gs[3];
    k.gelu(gs, gspecial, 3);
    t.expect(std::isinf(gs[0]) && gs[0] > 0 && std::isnan(gs[1]) && std::isnan(gs[2]), name + ": GELU(inf) = inf, GELU(-inf) and GELU(NaN) are NaN, as on CUDA");
  }
}

// The CPU attention refuses an output over its inputs (its products' overlap check), rather than
// returning what a product over its own output computes.
void check_attention_aliasing(Checks& t) {
  const sapipe_nn_ops* ops = sapipe_cpu_nn_ops();
  const size_t batch = 1, seq = 40, heads = 2, dim = 4, n = batch * seq * heads * dim;
  std::vector<float> q(n, 0.1f), k(n, 0.2f), v(n, 0.3f), o(n), lse(batch * heads * seq), dout(n, 0.5f), dq(n);
  t.expect(ops->attention(o.data(), lse.data(), q.data(), k.data(), v.data(), batch, seq, heads, dim, 0.5f, nullptr) == SAPIPE_OK,
           "attention with separate tensors runs");
  t.expect(ops->attention(v.data(), lse.data(), q.data(), k.data(), v.data(), batch, seq, heads, dim, 0.5f, nullptr) == SAPIPE_ERR_ALIASING,
           "attention with o over v is refused with SAPIPE_ERR_ALIASING");
  std::fill(v.begin(), v.end(), 0.3f);
  std::vector<float> dv(n);
  t.expect(ops->attention_backward(dq.data(), q.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), o.data(), lse.data(), batch,
                                   seq, heads, dim, 0.5f, nullptr) == SAPIPE_ERR_ALIASING,
           "attention_backward with dk over q is refused with SAPIPE_ERR_ALIASING");
}

// One JSON object per line for each variant: what test/native/lists.test.ts compares with
// apps/bench/kernel-variants.ts.
int list_variants() {
  for (const Variant& v : update_variants()) {
    const sapipe_update_config& c = v.config;
    std::printf(
        "{\"name\":\"%s\",\"optimizer\":%d,\"lr\":%g,\"weightDecay\":%g,\"momentum\":%g,\"dampening\":%g,"
        "\"nesterov\":%s,\"spikeDelay\":%d,\"gradScale\":%g,\"compensation\":%d,\"compensationLambda\":%g,"
        "\"prediction\":%d,\"estimate\":%d,\"compensateEstimate\":%s,\"worldSize\":%g,\"predictionSteps\":%g}\n",
        v.name.c_str(), c.optimizer, c.lr, c.weight_decay, c.momentum, c.dampening, c.nesterov ? "true" : "false",
        c.spike_delay, c.grad_scale, c.compensation, c.compensation_lambda, c.prediction, c.estimate,
        c.compensate_estimate ? "true" : "false", c.world_size, c.prediction_steps);
  }
  return 0;
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--list-variants") == 0) return list_variants();
  std::string fakes = self_directory() + "/test-fakes";
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--fakes") == 0) fakes = argv[i + 1];
  Checks t;
  check_variants(t);
  check_guard(t);
  check_out_of_place(t);
  check_helpers(t);
  check_buffers(t);
  check_cpu_clock(t);
  check_simd_names(t);
  check_nn_elementwise(t);
  check_attention_aliasing(t);
  check_loaders(t, fakes);
  check_cuda_plugin_choice(t, fakes);
  check_execution_queue(t);
  check_latches(t);
  check_queued_update(t);
  check_thread_pools(t);
  check_local_ops(t);
  check_nccl_ops(t, fakes);
  check_cuda_plugin_reports(t, fakes);
  check_device_memory(t, fakes);
  return t.finish("sapipe_cpu_check");
}
