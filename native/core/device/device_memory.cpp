#include "device_memory.h"

#include <vector>

namespace sapipe {
namespace {

// The plugin's reason for a failed call, or nothing for success.
sapipe_status noted(const sapipe_cuda_plugin_v1* cuda, sapipe_status s, std::string* detail) {
  if (s != SAPIPE_OK) *detail = cuda->last_error();
  return s;
}

// A device word for a count, freed with the scope.
class DeviceWord {
 public:
  explicit DeviceWord(const sapipe_cuda_plugin_v1* cuda) : cuda_(cuda) {}
  ~DeviceWord() {
    if (word_ != nullptr) cuda_->free_device(word_);
  }
  DeviceWord(const DeviceWord&) = delete;
  DeviceWord& operator=(const DeviceWord&) = delete;
  sapipe_status allocate(std::string* detail) { return noted(cuda_, cuda_->malloc_device(&word_, sizeof(int64_t)), detail); }
  int64_t* get() const { return static_cast<int64_t*>(word_); }

 private:
  const sapipe_cuda_plugin_v1* cuda_;
  void* word_ = nullptr;
};

}  // namespace

DeviceAllocation::~DeviceAllocation() {
  // cudaFree finds the device from the address (unified addressing): no device switch needed.
  if (data != nullptr && cuda != nullptr) cuda->free_device(data);
}

sapipe_status DeviceAllocation::allocate(const sapipe_cuda_plugin_v1* cuda, int32_t device, size_t length,
                                         std::shared_ptr<DeviceAllocation>* out, std::string* detail) {
  auto memory = std::make_shared<DeviceAllocation>();
  memory->cuda = cuda;
  memory->device = device;
  memory->length = length;
  void* ptr = nullptr;
  if (sapipe_status s = noted(cuda, cuda->malloc_device(&ptr, length * sizeof(float)), detail); s != SAPIPE_OK) return s;
  memory->data = static_cast<float*>(ptr);
  // A staging copy through the legacy stream is slow but rare: allocation is not on a training
  // loop's path.
  if (length > 0) {
    std::vector<float> zeros(length, 0.0f);
    if (sapipe_status s = copy_to_device_sync(cuda, memory->data, zeros.data(), length, detail); s != SAPIPE_OK) return s;
  }
  *out = std::move(memory);
  return SAPIPE_OK;
}

sapipe_status copy_to_device_sync(const sapipe_cuda_plugin_v1* cuda, float* dst, const float* src, size_t count, std::string* detail,
                                  void* stream) {
  if (sapipe_status s = noted(cuda, cuda->copy_to_device(dst, src, count * sizeof(float), stream), detail); s != SAPIPE_OK) return s;
  return noted(cuda, cuda->stream_synchronize(stream), detail);
}

sapipe_status copy_to_host_sync(const sapipe_cuda_plugin_v1* cuda, float* dst, const float* src, size_t count, std::string* detail,
                                  void* stream) {
  if (sapipe_status s = noted(cuda, cuda->copy_to_host(dst, src, count * sizeof(float), stream), detail); s != SAPIPE_OK) return s;
  return noted(cuda, cuda->stream_synchronize(stream), detail);
}

sapipe_status copy_on_device_sync(const sapipe_cuda_plugin_v1* cuda, float* dst, const float* src, size_t count, std::string* detail,
                                  void* stream) {
  if (sapipe_status s = noted(cuda, cuda->copy_on_device(dst, src, count * sizeof(float), stream), detail); s != SAPIPE_OK) return s;
  return noted(cuda, cuda->stream_synchronize(stream), detail);
}

sapipe_status count_non_finite_on_device(const sapipe_cuda_plugin_v1* cuda, const float* x, size_t count, int64_t* out,
                                         std::string* detail) {
  DeviceWord word(cuda);
  if (sapipe_status s = word.allocate(detail); s != SAPIPE_OK) return s;
  int64_t bad = 0;
  sapipe_status s = cuda->count_non_finite(x, count, word.get(), nullptr);
  if (s == SAPIPE_OK) s = cuda->copy_to_host(&bad, word.get(), sizeof bad, nullptr);
  if (s == SAPIPE_OK) s = cuda->stream_synchronize(nullptr);
  if (noted(cuda, s, detail) != SAPIPE_OK) return s;
  *out = bad;
  return SAPIPE_OK;
}

sapipe_status scatter_add_packs_on_device(const sapipe_cuda_plugin_v1* cuda, float* out, size_t out_length, const float* all, size_t width,
                                          size_t k, size_t ranks, float scale, bool zero_first, int64_t* skipped, std::string* detail) {
  DeviceWord word(cuda);
  if (sapipe_status s = word.allocate(detail); s != SAPIPE_OK) return s;
  const int64_t zero = 0;
  int64_t bad = 0;
  sapipe_status s = cuda->copy_to_device(word.get(), &zero, sizeof zero, nullptr);
  if (s == SAPIPE_OK && zero_first) s = cuda->zero(out, out_length, nullptr);
  for (size_t r = 0; s == SAPIPE_OK && r < ranks; ++r) {
    const float* pack = all + r * width;
    s = cuda->scatter_add(out, out_length, reinterpret_cast<const int32_t*>(pack), pack + k, k, scale, word.get(), nullptr);
  }
  if (s == SAPIPE_OK) s = cuda->copy_to_host(&bad, word.get(), sizeof bad, nullptr);
  if (s == SAPIPE_OK) s = cuda->stream_synchronize(nullptr);
  if (noted(cuda, s, detail) != SAPIPE_OK) return s;
  *skipped = bad;
  return SAPIPE_OK;
}

}  // namespace sapipe
