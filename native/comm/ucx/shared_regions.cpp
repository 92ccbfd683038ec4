#include "shared_regions.h"

namespace sapipe::comm::ucx {

std::shared_ptr<AlignedBuffer> SharedRegions::allocate(size_t elements, sapipe_status* status, std::string* detail) {
  const size_t bytes = elements * sizeof(float);
  void* data = nullptr;
  sapipe_comm_region* region = nullptr;
  *status = plugin_->region_alloc(transport_, bytes, &data, &region);
  if (*status != SAPIPE_OK) {
    *detail = plugin_->last_error();
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    own_[reinterpret_cast<uintptr_t>(data)] = Own{region, bytes, next_id_++, false};
  }
  // The buffer keeps the registry (and through the plugin, the transport's context) alive.
  std::shared_ptr<SharedRegions> self = shared_from_this();
  auto buffer = AlignedBuffer::adopt(static_cast<float*>(data), elements, [self](float* d) { self->release(d); });
  if (!buffer) {
    release(static_cast<float*>(data));
    *status = SAPIPE_ERR_OUT_OF_MEMORY;
    *detail = "out of memory";
  }
  return buffer;
}

void SharedRegions::release(float* data) {
  sapipe_comm_region* region = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = own_.find(reinterpret_cast<uintptr_t>(data));
    if (it == own_.end()) return;
    region = it->second.region;
    if (it->second.announced) freed_.push_back(it->second.id);
    own_.erase(it);
  }
  plugin_->region_free(transport_, region);
}

SharedRegions::Use SharedRegions::find(const void* data, size_t bytes) {
  Use use;
  if (bytes == 0) return use;
  const auto at = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = own_.upper_bound(at);
  if (it == own_.begin()) return use;
  --it;
  const Own& own = it->second;
  if (at - it->first > own.bytes || bytes > own.bytes - (at - it->first)) return use;
  use.id = own.id;
  use.offset = at - it->first;
  if (!own.announced) {
    const void* key = nullptr;
    size_t key_bytes = 0;
    if (plugin_->region_key(transport_, own.region, &key, &key_bytes) != SAPIPE_OK) return Use{};
    use.key.assign(static_cast<const uint8_t*>(key), static_cast<const uint8_t*>(key) + key_bytes);
  }
  return use;
}

void SharedRegions::announced(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [address, own] : own_)
    if (own.id == id) own.announced = true;
}

std::vector<uint64_t> SharedRegions::take_freed(size_t max) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint64_t> ids;
  while (!freed_.empty() && ids.size() < max) {
    ids.push_back(freed_.front());
    freed_.pop_front();
  }
  return ids;
}

bool SharedRegions::map(int peer, uint64_t id, const uint8_t* key, size_t bytes, std::string* detail) {
  void* data = nullptr;
  size_t length = 0;
  sapipe_comm_peer_region* mapping = nullptr;
  if (plugin_->peer_map(transport_, peer, key, bytes, &data, &length, &mapping) != SAPIPE_OK) {
    *detail = plugin_->last_error();
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Mapped& m = mapped_[{peer, id}];
  if (m.mapping != nullptr) plugin_->peer_unmap(transport_, m.mapping);
  m = Mapped{mapping, static_cast<uint8_t*>(data), length};
  return true;
}

void SharedRegions::unmap(int peer, uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = mapped_.find({peer, id});
  if (it == mapped_.end()) return;
  plugin_->peer_unmap(transport_, it->second.mapping);
  mapped_.erase(it);
}

float* SharedRegions::view(int peer, uint64_t id, uint64_t offset, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = mapped_.find({peer, id});
  if (it == mapped_.end() || offset > it->second.length || bytes > it->second.length - offset) return nullptr;
  return reinterpret_cast<float*>(it->second.data + offset);
}

void SharedRegions::unmap_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, m] : mapped_) plugin_->peer_unmap(transport_, m.mapping);
  mapped_.clear();
}

}  // namespace sapipe::comm::ucx
