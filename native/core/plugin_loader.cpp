#include "plugin_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace sapipe {
namespace {

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

// The function pointers of a table follow its header; each must be set.
bool all_slots_set(const sapipe_plugin_header* table, size_t table_size) {
  const char* base = reinterpret_cast<const char*>(table);
  for (size_t at = sizeof(sapipe_plugin_header); at + sizeof(void*) <= table_size; at += sizeof(void*)) {
    void* slot = nullptr;
    std::memcpy(&slot, base + at, sizeof slot);
    if (slot == nullptr) return false;
  }
  return true;
}

}  // namespace

bool plugin_file_exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

std::string module_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&module_directory), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string file = info.dli_fname;
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? "." : file.substr(0, slash);
}

PluginLoad load_plugin(const std::string& path, const char* name, uint32_t abi_version, size_t min_table_size) {
  PluginLoad out;
  out.path = path;
  if (!plugin_file_exists(path)) {
    out.reason = std::string("the ") + name + " plugin was not found: looked for " + path;
    return out;
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    out.reason = std::string("the ") + name + " plugin " + path + " could not be opened: " + dl_error();
    return out;
  }
  auto entry = reinterpret_cast<sapipe_plugin_entry_fn>(dlsym(handle, SAPIPE_PLUGIN_ENTRY_SYMBOL));
  const sapipe_plugin_header* table = entry ? entry(abi_version) : nullptr;
  if (entry == nullptr) {
    out.reason = std::string("the ") + name + " plugin " + path + " does not export the symbol " + SAPIPE_PLUGIN_ENTRY_SYMBOL;
  } else if (table == nullptr || table->abi_version != abi_version) {
    out.reason = std::string("the ") + name + " plugin " + path + " does not serve plugin ABI version " +
                 std::to_string(abi_version) + (table ? " (it offers " + std::to_string(table->abi_version) + ")" : "") +
                 ": rebuild it with this version of sapipe";
  } else if (table->name == nullptr || std::strcmp(table->name, name) != 0) {
    out.reason = std::string("the file ") + path + " is not the " + name + " plugin (it names itself " +
                 (table->name ? table->name : "nothing") + ")";
  } else if (table->table_size < min_table_size || !all_slots_set(table, min_table_size)) {
    out.reason = std::string("the ") + name + " plugin " + path + " returned an incomplete function table";
  } else {
    out.table = table;
    return out;  // stays open: the table points into it
  }
  dlclose(handle);
  return out;
}

PluginLoad load_plugin_from_env(const char* override_var, const char* file, const char* name, uint32_t abi_version,
                                size_t min_table_size, const char* missing_hint) {
  const char* override_path = std::getenv(override_var);
  std::string path;
  if (override_path != nullptr && *override_path != '\0') {
    path = override_path;
  } else {
    const std::string dir = module_directory();
    path = (dir.empty() ? std::string(".") : dir) + "/" + file;
  }
  PluginLoad load = load_plugin(path, name, abi_version, min_table_size);
  if (load.table == nullptr && !plugin_file_exists(path) && override_path == nullptr) load.reason += missing_hint;
  return load;
}

PluginLoad load_ucx_plugin_uncached() {
  return load_plugin_from_env("SAPIPE_UCX_PLUGIN", "sapipe_ucx.so", "ucx", SAPIPE_COMM_TRANSPORT_ABI_VERSION,
                              sizeof(sapipe_comm_plugin_v1),
                              " (this build has no UCX plugin: it is built by `npm run build:native` when UCX is found, "
                              "e.g. after `apt-get install libucx-dev`)");
}

const PluginLoad& ucx_plugin() {
  static std::once_flag once;
  static PluginLoad load;
  std::call_once(once, [] { load = load_ucx_plugin_uncached(); });
  return load;
}

}  // namespace sapipe
