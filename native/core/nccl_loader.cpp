#include "nccl_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <sstream>
#include <vector>

namespace sapipe::nccl {
namespace {

constexpr const char* kLibrary = "libnccl.so.2";

std::vector<std::string> candidates(const char* search_path) {
  std::vector<std::string> out;
  if (search_path != nullptr) {
    std::stringstream in(search_path);
    std::string entry;
    while (std::getline(in, entry, ':')) {
      if (entry.empty()) continue;
      // A folder gets the library name appended; an entry naming a file is used as is.
      const bool is_file = entry.size() >= 3 && entry.find(".so") != std::string::npos;
      out.push_back(is_file ? entry : entry + (entry.back() == '/' ? "" : "/") + kLibrary);
    }
  }
  out.emplace_back(kLibrary);  // the dynamic linker's search (LD_LIBRARY_PATH, ld.so.cache)
  return out;
}

template <class Fn>
bool resolve(void* handle, const char* name, Fn& fn, std::string* missing) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (fn == nullptr && missing->empty()) *missing = name;
  return fn != nullptr;
}

}  // namespace

sapipe_status load_uncached(const char* search_path, Api* api, std::string* reason) {
  std::string tried;
  for (const std::string& file : candidates(search_path)) {
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += "\n  " + file + ": " + (why ? why : "dlopen failed");
      continue;
    }
    Api a{};
    std::string missing;
    resolve(handle, "ncclGetVersion", a.GetVersion, &missing);
    resolve(handle, "ncclGetUniqueId", a.GetUniqueId, &missing);
    resolve(handle, "ncclCommInitRank", a.CommInitRank, &missing);
    resolve(handle, "ncclCommDestroy", a.CommDestroy, &missing);
    resolve(handle, "ncclCommAbort", a.CommAbort, &missing);
    resolve(handle, "ncclCommGetAsyncError", a.CommGetAsyncError, &missing);
    resolve(handle, "ncclAllReduce", a.AllReduce, &missing);
    resolve(handle, "ncclReduceScatter", a.ReduceScatter, &missing);
    resolve(handle, "ncclAllGather", a.AllGather, &missing);
    resolve(handle, "ncclBroadcast", a.Broadcast, &missing);
    resolve(handle, "ncclSend", a.Send, &missing);
    resolve(handle, "ncclRecv", a.Recv, &missing);
    resolve(handle, "ncclGroupStart", a.GroupStart, &missing);
    resolve(handle, "ncclGroupEnd", a.GroupEnd, &missing);
    resolve(handle, "ncclGetErrorString", a.GetErrorString, &missing);
    if (!missing.empty()) {
      dlclose(handle);
      *reason = "NCCL at " + file + " lacks the symbol " + missing + " (NCCL 2.10 or newer is needed)";
      return SAPIPE_ERR_BACKEND_UNAVAILABLE;
    }
    if (a.GetVersion(&a.version) != kSuccess) a.version = 0;
    a.path = file;
    *api = a;
    return SAPIPE_OK;  // the handle stays open for the life of the process
  }
  *reason = std::string("NCCL was not found: looked for ") + kLibrary +
            (search_path && *search_path ? " in SAPIPE_NCCL_PATH and" : " in") +
            " the system library path:" + tried +
            "\nInstall NCCL 2 (the libnccl2 package, or the nvidia-nccl-cu12 wheel) or set SAPIPE_NCCL_PATH to its folder";
  return SAPIPE_ERR_BACKEND_UNAVAILABLE;
}

sapipe_status load(const char* search_path, const Api** api, std::string* reason) {
  static std::mutex mutex;
  static Api loaded{};
  static bool ok = false;
  std::lock_guard<std::mutex> lock(mutex);
  // A failure is not cached: the user may fix SAPIPE_NCCL_PATH and try again in the same process.
  if (!ok) {
    sapipe_status s = load_uncached(search_path, &loaded, reason);
    if (s != SAPIPE_OK) return s;
    ok = true;
  }
  *api = &loaded;
  return SAPIPE_OK;
}

}  // namespace sapipe::nccl
