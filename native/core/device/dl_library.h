// Opening an optional shared library at run time (NCCL, cuBLAS): the search-path entries a user
// gives, the first candidate that dlopen accepts (with why every earlier one failed), and the
// resolution of its entry points, naming the first one missing. The loaders keep their own
// candidate lists, symbols and messages.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "sapipe/status.h"

namespace sapipe::core {

// The entries of a colon-separated search path (an environment variable's value; may be null).
// An entry naming a file (".so" in it) is kept as is; a folder gets each of `names` appended.
std::vector<std::string> search_path_candidates(const char* search_path, const std::vector<std::string>& names);

// dlopens the candidates in order (RTLD_NOW | RTLD_LOCAL) and returns the first handle, setting
// *file to it; nullptr when none opens. *tried gets a line per failure: "\n  <file>: <why>".
void* open_first(const std::vector<std::string>& candidates, std::string* file, std::string* tried);

// fn = the symbol `name` of handle; the first symbol that is missing is recorded in *missing.
void* find_symbol(void* handle, const char* name, std::string* missing);
template <class Fn>
void resolve_symbol(void* handle, const char* name, Fn& fn, std::string* missing) {
  fn = reinterpret_cast<Fn>(find_symbol(handle, name, missing));
}

// Closes a handle whose library turned out unusable.
void close_library(void* handle);

// The library of `Api` loaded once per process by load_uncached(Api*, std::string* reason). A
// failure is not cached: the user may fix the search path and try again in the same process.
template <class Api, class LoadUncached>
sapipe_status load_once(LoadUncached&& load_uncached, const Api** api, std::string* reason) {
  static std::mutex mutex;
  static Api loaded{};
  static bool ok = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (!ok) {
    const sapipe_status s = load_uncached(&loaded, reason);
    if (s != SAPIPE_OK) return s;
    ok = true;
  }
  *api = &loaded;
  return SAPIPE_OK;
}

}  // namespace sapipe::core
