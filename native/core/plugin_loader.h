// Opening a plugin shared library at run time (DESIGN.md: the addon never links CUDA, NCCL or
// UCX). A plugin that is missing, lacks its entry point, or serves another ABI version is reported
// as a reason string naming the file and what was looked for; the process never fails to load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "sapipe/comm.h"
#include "sapipe/plugin.h"

namespace sapipe {

struct PluginLoad {
  const sapipe_plugin_header* table = nullptr;  // null when loading failed
  std::string path;                             // the file tried
  std::string reason;                           // why it failed ("" on success)
};

// The folder holding the shared object this code is part of (the addon, or a harness binary),
// found with dladdr; "" when unknown.
std::string module_directory();

// Opens path, resolves sapipe_plugin_entry, asks it for abi_version, and checks that the table it
// returns has that version, the expected name and at least min_table_size bytes whose function
// pointers (every pointer-sized slot after the header) are all set. The library stays open for
// the life of the process when it succeeds, and is closed when it does not.
PluginLoad load_plugin(const std::string& path, const char* name, uint32_t abi_version, size_t min_table_size);

// The CUDA plugin: SAPIPE_CUDA_PLUGIN when set (a file), else sapipe_cuda.so beside the addon.
// Loaded once per process; later calls return the first result.
const PluginLoad& cuda_plugin();
// The same search, not cached: for tests that point SAPIPE_CUDA_PLUGIN at different files.
PluginLoad load_cuda_plugin_uncached();

// The UCX transport plugin (sapipe/comm.h): SAPIPE_UCX_PLUGIN when set, else sapipe_ucx.so beside
// the addon. When it exists but libucp.so.0 does not, dlopen fails and the reason says so.
const PluginLoad& ucx_plugin();
PluginLoad load_ucx_plugin_uncached();

}  // namespace sapipe
