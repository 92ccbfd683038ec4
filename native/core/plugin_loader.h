// Opening a plugin shared library at run time (DESIGN.md: the addon never links CUDA, NCCL or
// UCX). A plugin that is missing, lacks its entry point, or serves another ABI version is reported
// as a reason string naming the file and what was looked for; the process never fails to load.
// Finding the CUDA plugin is device code: device/cuda_plugin.h.
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
  // Where several files could serve (the CUDA plugins, device/cuda_plugin.h): why this one was
  // taken, and, when none of them can run here, each one's reason ("" otherwise).
  std::string choice;
  std::string candidates_reason;
};

bool plugin_file_exists(const std::string& path);

// The folder holding the shared object this code is part of (the addon, or a harness binary),
// found with dladdr; "" when unknown.
std::string module_directory();

// Opens path, resolves sapipe_plugin_entry, asks it for abi_version, and checks that the table it
// returns has that version, the expected name and at least min_table_size bytes whose function
// pointers (every pointer-sized slot after the header) are all set. The library stays open for
// the life of the process when it succeeds, and is closed when it does not.
PluginLoad load_plugin(const std::string& path, const char* name, uint32_t abi_version, size_t min_table_size);

// load_plugin of the file named by the environment variable `override_var` when set, else of
// `file` beside the addon; `missing_hint` is added when the default file does not exist (not built).
PluginLoad load_plugin_from_env(const char* override_var, const char* file, const char* name, uint32_t abi_version,
                                size_t min_table_size, const char* missing_hint);

// The UCX transport plugin (sapipe/comm.h): SAPIPE_UCX_PLUGIN when set, else sapipe_ucx.so beside
// the addon. When it exists but libucp.so.0 does not, dlopen fails and the reason says so.
const PluginLoad& ucx_plugin();
PluginLoad load_ucx_plugin_uncached();

}  // namespace sapipe
