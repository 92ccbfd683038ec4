// A plugin built for another ABI version: it returns a header announcing version 999 whatever it
// is asked, and the loader must refuse it.
#include "sapipe/plugin.h"

extern "C" __attribute__((visibility("default"))) const sapipe_plugin_header* sapipe_plugin_entry(uint32_t) {
  static const sapipe_plugin_header header = {999u, sizeof(sapipe_plugin_header), "cuda"};
  return &header;
}
