#include "cublas_loader.h"

#include <vector>

#include "dl_library.h"

namespace sapipe::cublas {
namespace {

constexpr int kNewestMajor = 13;
constexpr int kOldestMajor = 11;

std::string library(int major) { return "libcublas.so." + std::to_string(major); }

std::vector<std::string> candidates(const char* search_path, int preferred_major) {
  std::vector<std::string> names;
  if (preferred_major >= kOldestMajor && preferred_major <= kNewestMajor) names.push_back(library(preferred_major));
  for (int m = kNewestMajor; m >= kOldestMajor; --m)
    if (m != preferred_major) names.push_back(library(m));
  std::vector<std::string> out = core::search_path_candidates(search_path, names);
  out.insert(out.end(), names.begin(), names.end());  // the dynamic linker's search
  // The toolkit's own folder, which a driver-only or container install may not put on that path.
  for (const std::string& name : names) out.push_back("/usr/local/cuda/lib64/" + name);
  return out;
}

}  // namespace

sapipe_status load_uncached(const char* search_path, int preferred_major, Api* api, std::string* reason) {
  std::string file, tried;
  void* handle = core::open_first(candidates(search_path, preferred_major), &file, &tried);
  if (handle == nullptr) {
    *reason = std::string("cuBLAS was not found: looked for libcublas.so.") + std::to_string(kOldestMajor) + " to ." +
              std::to_string(kNewestMajor) + (search_path && *search_path ? " in SAPIPE_CUBLAS_PATH and" : " in") +
              " the system library path:" + tried +
              "\nInstall cuBLAS (the CUDA toolkit's libcublas, Debian's libcublas11/libcublas12, or the "
              "nvidia-cublas wheel) or set SAPIPE_CUBLAS_PATH to its folder";
    return SAPIPE_ERR_BACKEND_UNAVAILABLE;
  }
  Api a{};
  std::string missing;
  core::resolve_symbol(handle, "cublasCreate_v2", a.Create, &missing);
  core::resolve_symbol(handle, "cublasDestroy_v2", a.Destroy, &missing);
  core::resolve_symbol(handle, "cublasSetStream_v2", a.SetStream, &missing);
  core::resolve_symbol(handle, "cublasSgemm_v2", a.Sgemm, &missing);
  core::resolve_symbol(handle, "cublasGetProperty", a.GetProperty, &missing);
  if (!missing.empty()) {
    core::close_library(handle);
    *reason = "cuBLAS at " + file + " lacks the symbol " + missing + " (cuBLAS 11 or newer is needed)";
    return SAPIPE_ERR_BACKEND_UNAVAILABLE;
  }
  int major = 0, minor = 0, patch = 0;
  if (a.GetProperty(kMajor, &major) != kSuccess || a.GetProperty(kMinor, &minor) != kSuccess || a.GetProperty(kPatch, &patch) != kSuccess)
    major = minor = patch = 0;
  a.version = major * 10000 + minor * 100 + patch;
  a.path = file;
  *api = a;
  return SAPIPE_OK;  // the handle stays open for the life of the process
}

sapipe_status load(const char* search_path, int preferred_major, const Api** api, std::string* reason) {
  return core::load_once<Api>([&](Api* a, std::string* why) { return load_uncached(search_path, preferred_major, a, why); }, api,
                              reason);
}

}  // namespace sapipe::cublas
