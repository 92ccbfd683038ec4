#include "dl_library.h"

#include <dlfcn.h>

#include <sstream>

namespace sapipe::core {

std::vector<std::string> search_path_candidates(const char* search_path, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  if (search_path == nullptr) return out;
  std::stringstream in(search_path);
  std::string entry;
  while (std::getline(in, entry, ':')) {
    if (entry.empty()) continue;
    if (entry.find(".so") != std::string::npos) {
      out.push_back(entry);
      continue;
    }
    for (const std::string& name : names) out.push_back(entry + (entry.back() == '/' ? "" : "/") + name);
  }
  return out;
}

void* open_first(const std::vector<std::string>& candidates, std::string* file, std::string* tried) {
  for (const std::string& candidate : candidates) {
    void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      *file = candidate;
      return handle;
    }
    const char* why = dlerror();
    *tried += "\n  " + candidate + ": " + (why ? why : "dlopen failed");
  }
  return nullptr;
}

void* find_symbol(void* handle, const char* name, std::string* missing) {
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr && missing->empty()) *missing = name;
  return symbol;
}

void close_library(void* handle) { dlclose(handle); }

}  // namespace sapipe::core
