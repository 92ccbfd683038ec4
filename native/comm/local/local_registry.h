// The process-global registry of local groups, found by name. Every worker thread loads the addon
// separately, but the shared library (and so this registry) exists once per process.
#pragma once

#include <memory>
#include <string>

#include "local_group.h"

namespace sapipe::comm::local {

// Joins `rank` of the group `name` of `size` ranks, creating the group on first join. A name
// whose group has finished (every rank left, or it broke) starts a fresh group.
sapipe_status join_group(const std::string& name, int size, int rank, std::shared_ptr<Group>* out,
                         std::string* detail);

}  // namespace sapipe::comm::local
