#include "device_check.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "../core/device/cuda_plugin.h"
#include "../core/device/device_memory.h"
#include "../core/plugin_loader.h"

namespace sapipe::tests {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const sapipe_cuda_plugin_v1* load_fake(Checks& t, const std::string& fakes, const char* file, std::string* path) {
  *path = fakes + "/" + file;
  PluginLoad load = load_plugin(*path, "cuda", SAPIPE_CUDA_PLUGIN_ABI_VERSION, SAPIPE_CUDA_PLUGIN_V1_BASE_SIZE);
  std::string reason;
  const sapipe_cuda_plugin_v1* cuda = cuda_table(load, &reason);
  t.expect(cuda != nullptr, std::string(file) + " loads: " + reason);
  return cuda;
}

}  // namespace

void check_cuda_plugin_reports(Checks& t, const std::string& fakes) {
  PluginLoad missing = load_plugin(fakes + "/no-such-plugin.so", "cuda", SAPIPE_CUDA_PLUGIN_ABI_VERSION, SAPIPE_CUDA_PLUGIN_V1_BASE_SIZE);
  std::string reason;
  t.expect(cuda_table(missing, &reason) == nullptr && reason == missing.reason, "a plugin that did not load has no table, and says why");
  CudaLibraryReport lib = report_cuda_library(nullptr, "no plugin here", CudaLibrary::kCublas);
  t.expect(!lib.available && lib.reason == "cuBLAS is used through the CUDA plugin, which is unavailable: no plugin here",
           "a library of a missing plugin is unavailable for the plugin's reason: " + lib.reason);

  std::string path;
  if (const sapipe_cuda_plugin_v1* none = load_fake(t, fakes, "sapipe_test_plugin_without_device.so", &path)) {
    CudaReport report = report_cuda_devices(none);
    t.expect(!report.available && !report.counted && contains(report.reason, "the CUDA plugin loaded, but") &&
                 contains(report.reason, "no CUDA device"),
             "a plugin that sees no device is unavailable, saying so: " + report.reason);
    t.expect(has_device_entries(none, path, &reason), "a plugin of the whole v1 table has the appended entries");
    lib = report_cuda_library(none, "", CudaLibrary::kNccl);
    t.expect(!lib.available && !lib.reason.empty(), "a plugin whose NCCL probe fails reports its reason: " + lib.reason);
  }
  if (const sapipe_cuda_plugin_v1* base = load_fake(t, fakes, "sapipe_test_plugin_v1_base.so", &path)) {
    reason.clear();
    t.expect(!has_device_entries(base, path, &reason) && contains(reason, "predates device buffers") && contains(reason, path) &&
                 contains(reason, "npm run build:native"),
             "a plugin built before the appended entries is refused for device buffers, naming the file: " + reason);
    lib = report_cuda_library(base, "", CudaLibrary::kCublas);
    t.expect(!lib.available && contains(lib.reason, "predates its cuBLAS entries"), "a table too short for a probe predates it: " + lib.reason);
  }
  if (const sapipe_cuda_plugin_v1* host = load_fake(t, fakes, "sapipe_test_plugin_host_memory.so", &path)) {
    CudaReport report = report_cuda_devices(host);
    t.expect(report.available && report.counted && report.devices.size() == 1 && report.devices[0].listed &&
                 std::strcmp(report.devices[0].info.name, "host memory (emulated device)") == 0,
             "a plugin with a device that runs its code is available and lists it");
    lib = report_cuda_library(host, "", CudaLibrary::kNccl);
    t.expect(lib.available && lib.version == 22809 && lib.path == "host-memory emulation (ranks over Unix sockets)",
             "a library whose probe answers is available with its version and path");
  }
}

void check_device_memory(Checks& t, const std::string& fakes) {
  std::string path, detail;
  const sapipe_cuda_plugin_v1* cuda = load_fake(t, fakes, "sapipe_test_plugin_host_memory.so", &path);
  if (cuda == nullptr) return;
  std::shared_ptr<DeviceAllocation> a, b;
  const size_t n = 19;
  t.expect(DeviceAllocation::allocate(cuda, 0, n, &a, &detail) == SAPIPE_OK && a && a->length == n && a->device == 0,
           "device memory allocates: " + detail);
  if (!a) return;
  std::vector<float> host(n, -1.0f);
  t.expect(copy_to_host_sync(cuda, host.data(), a->data, n, &detail) == SAPIPE_OK && host == std::vector<float>(n, 0.0f),
           "device memory starts zeroed");
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i);
  host[3] = NAN;
  host[7] = INFINITY;
  t.expect(copy_to_device_sync(cuda, a->data, host.data(), n, &detail) == SAPIPE_OK, "a host-to-device copy completes");
  int64_t bad = -1;
  t.expect(count_non_finite_on_device(cuda, a->data, n, &bad, &detail) == SAPIPE_OK && bad == 2, "non-finite elements are counted on the device");
  DeviceAllocation::allocate(cuda, 0, n, &b, &detail);
  std::vector<float> back(n);
  t.expect(b && copy_on_device_sync(cuda, b->data, a->data + 10, 5, &detail) == SAPIPE_OK &&
               copy_to_host_sync(cuda, back.data(), b->data, n, &detail) == SAPIPE_OK && back[0] == 10.0f && back[4] == 14.0f && back[5] == 0.0f,
           "a device-to-device copy moves the range");

  // Two ranks' packs of k = 2 pairs, width 5: rank 0 adds 1 at 2 and 2 at 4; rank 1 adds 3 at 2
  // and names an index outside the buffer.
  const size_t k = 2, width = 5;
  std::vector<float> packs(2 * width, 0.0f);
  const int32_t indices[2][2] = {{2, 4}, {2, 99}};
  for (size_t r = 0; r < 2; ++r) {
    std::memcpy(&packs[r * width], indices[r], sizeof indices[r]);
    packs[r * width + k] = r == 0 ? 1.0f : 3.0f;
    packs[r * width + k + 1] = r == 0 ? 2.0f : 5.0f;
  }
  std::shared_ptr<DeviceAllocation> all, out;
  DeviceAllocation::allocate(cuda, 0, packs.size(), &all, &detail);
  DeviceAllocation::allocate(cuda, 0, 6, &out, &detail);
  copy_to_device_sync(cuda, all->data, packs.data(), packs.size(), &detail);
  const std::vector<float> ones(6, 1.0f);
  copy_to_device_sync(cuda, out->data, ones.data(), 6, &detail);
  int64_t skipped = -1;
  std::vector<float> sum(6);
  sapipe_status s = scatter_add_packs_on_device(cuda, out->data, 6, all->data, width, k, 2, 0.5f, true, &skipped, &detail);
  copy_to_host_sync(cuda, sum.data(), out->data, 6, &detail);
  t.expect(s == SAPIPE_OK && skipped == 1 && sum == std::vector<float>({0, 0, 2.0f, 0, 1.0f, 0}),
           "the ranks' packs are scatter-added in order, an index outside the buffer counted: " + detail);
  copy_to_device_sync(cuda, out->data, ones.data(), 6, &detail);
  s = scatter_add_packs_on_device(cuda, out->data, 6, all->data, width, k, 1, 1.0f, false, &skipped, &detail);
  copy_to_host_sync(cuda, sum.data(), out->data, 6, &detail);
  t.expect(s == SAPIPE_OK && skipped == 0 && sum == std::vector<float>({1, 1, 2.0f, 1, 3.0f, 1}), "scatter-add without zeroing adds to the buffer");
}

}  // namespace sapipe::tests
