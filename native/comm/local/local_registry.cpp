#include "local_registry.h"

#include <map>
#include <mutex>

namespace sapipe::comm::local {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::weak_ptr<Group>> groups;
};

Registry& registry() {
  // Never destroyed: worker threads may still leave their groups while the process exits.
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

sapipe_status join_group(const std::string& name, int size, int rank, std::shared_ptr<Group>* out,
                         std::string* detail) {
  if (size < 1 || rank < 0 || rank >= size) {
    *detail = "rank must be in [0, size)";
    return SAPIPE_ERR_INVALID_ARGUMENT;
  }
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::shared_ptr<Group> group = reg.groups[name].lock();
  if (!group || group->finished()) {
    group = std::make_shared<Group>(name, size);
    reg.groups[name] = group;
  }
  if (group->size() != size) {
    *detail = "group \"" + name + "\" has " + std::to_string(group->size()) + " ranks but this rank was given size " +
              std::to_string(size) + "; every rank must pass the same size";
    return SAPIPE_ERR_SIZE_MISMATCH;
  }
  if (group->join(rank) != SAPIPE_OK) {
    *detail = "rank " + std::to_string(rank) + " of group \"" + name + "\" has already joined; give each rank its own number";
    return SAPIPE_ERR_INVALID_ARGUMENT;
  }
  *out = group;
  return SAPIPE_OK;
}

}  // namespace sapipe::comm::local
