// A minimal test reporter for the harnesses: one line per failed check, a summary, exit status.
#pragma once

#include <cstdio>
#include <string>

namespace sapipe::tests {

struct Checks {
  int passed = 0, failed = 0;
  void expect(bool ok, const std::string& what) {
    if (ok) ++passed;
    else {
      ++failed;
      std::printf("not ok - %s\n", what.c_str());
    }
  }
  int finish(const char* suite) const {
    std::printf("%s: %d passed, %d failed\n", suite, passed, failed);
    return failed == 0 ? 0 : 1;
  }
};

}  // namespace sapipe::tests
