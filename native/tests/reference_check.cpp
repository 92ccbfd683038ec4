#include "reference_check.h"

#include <string>
#include <utility>
#include <vector>

#include "scalar_reference.h"

namespace sapipe::tests {

namespace {
const size_t kSizes[] = {1, 3, 17, 1000, 4099};
constexpr double kRtol = 2e-5, kAtol = 1e-6;
}  // namespace

void check_variants_against_reference(Checks& t, const UpdateUnderTest& update, int steps) {
  for (const Variant& variant : update_variants()) {
    for (size_t n : kSizes) {
      HostState tested, ref;
      tested.fill(n + 8, static_cast<unsigned>(n * 31 + variant.name.size()));
      ref = tested;
      // Odd offsets put every buffer off its alignment; the elements outside must stay put.
      const size_t offset = n % 2 == 1 ? 3 : 0;
      for (int step = 1; step <= steps; ++step) {
        sapipe_update_config c = variant.config;
        c.step = step;
        c.momentum_is_empty = step == 1;
        c.have_prev_local = step > 1;
        const bool applied = update(c, tested, offset, n);
        sapipe_update_buffers br = ref.buffers(offset, n);
        const bool ref_applied = reference_update(c, br);
        const std::string where = variant.name + " n=" + std::to_string(n) + " step " + std::to_string(step);
        t.expect(applied && ref_applied, where + ": applied");
        const std::pair<const char*, std::pair<std::vector<float>*, std::vector<float>*>> outputs[] = {
            {"w", {&tested.w, &ref.w}},           {"m", {&tested.m, &ref.m}},
            {"v", {&tested.v, &ref.v}},           {"backup", {&tested.backup, &ref.backup}},
            {"w_hat", {&tested.predicted, &ref.predicted}}, {"prev_local", {&tested.prev_local, &ref.prev_local}}};
        for (const auto& [name, pair] : outputs) {
          const double e = worst_error(*pair.first, *pair.second, kRtol, kAtol);
          t.expect(e <= 1.0, where + ": " + name + " within tolerance (worst " + std::to_string(e) + ")");
        }
      }
    }
  }
}

}  // namespace sapipe::tests
