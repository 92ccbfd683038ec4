#include "nccl_loader.h"

#include "dl_library.h"

namespace sapipe::nccl {
namespace {

constexpr const char* kLibrary = "libnccl.so.2";

std::vector<std::string> candidates(const char* search_path) {
  std::vector<std::string> out = core::search_path_candidates(search_path, {kLibrary});
  out.emplace_back(kLibrary);  // the dynamic linker's search (LD_LIBRARY_PATH, ld.so.cache)
  return out;
}

}  // namespace

sapipe_status load_uncached(const char* search_path, Api* api, std::string* reason) {
  std::string file, tried;
  void* handle = core::open_first(candidates(search_path), &file, &tried);
  if (handle == nullptr) {
    *reason = std::string("NCCL was not found: looked for ") + kLibrary +
              (search_path && *search_path ? " in SAPIPE_NCCL_PATH and" : " in") + " the system library path:" + tried +
              "\nInstall NCCL 2 (the libnccl2 package, or the nvidia-nccl-cu12 wheel) or set SAPIPE_NCCL_PATH to its folder";
    return SAPIPE_ERR_BACKEND_UNAVAILABLE;
  }
  Api a{};
  std::string missing;
  core::resolve_symbol(handle, "ncclGetVersion", a.GetVersion, &missing);
  core::resolve_symbol(handle, "ncclGetUniqueId", a.GetUniqueId, &missing);
  core::resolve_symbol(handle, "ncclCommInitRank", a.CommInitRank, &missing);
  core::resolve_symbol(handle, "ncclCommDestroy", a.CommDestroy, &missing);
  core::resolve_symbol(handle, "ncclCommAbort", a.CommAbort, &missing);
  core::resolve_symbol(handle, "ncclCommGetAsyncError", a.CommGetAsyncError, &missing);
  core::resolve_symbol(handle, "ncclAllReduce", a.AllReduce, &missing);
  core::resolve_symbol(handle, "ncclReduceScatter", a.ReduceScatter, &missing);
  core::resolve_symbol(handle, "ncclAllGather", a.AllGather, &missing);
  core::resolve_symbol(handle, "ncclBroadcast", a.Broadcast, &missing);
  core::resolve_symbol(handle, "ncclSend", a.Send, &missing);
  core::resolve_symbol(handle, "ncclRecv", a.Recv, &missing);
  core::resolve_symbol(handle, "ncclGroupStart", a.GroupStart, &missing);
  core::resolve_symbol(handle, "ncclGroupEnd", a.GroupEnd, &missing);
  core::resolve_symbol(handle, "ncclGetErrorString", a.GetErrorString, &missing);
  if (!missing.empty()) {
    core::close_library(handle);
    *reason = "NCCL at " + file + " lacks the symbol " + missing + " (NCCL 2.10 or newer is needed)";
    return SAPIPE_ERR_BACKEND_UNAVAILABLE;
  }
  if (a.GetVersion(&a.version) != kSuccess) a.version = 0;
  a.path = file;
  *api = a;
  return SAPIPE_OK;  // the handle stays open for the life of the process
}

sapipe_status load(const char* search_path, const Api** api, std::string* reason) {
  return core::load_once<Api>([&](Api* a, std::string* why) { return load_uncached(search_path, a, why); }, api, reason);
}

}  // namespace sapipe::nccl
