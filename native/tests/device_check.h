// Checks of what the addon reads from the CUDA plugin and does with device memory, run without
// Node and without a GPU, against the fake plugins CMake builds beside the harness: the reports of
// devices and run-time libraries, the appended entries (native/core/device/cuda_plugin.h), and device
// allocation, copies, counting and scatter-add over the plugin that emulates a device in host
// memory (native/core/device/device_memory.h).
#pragma once

#include <string>

#include "check.h"

namespace sapipe::tests {

void check_cuda_plugin_reports(Checks& t, const std::string& fakes);
void check_device_memory(Checks& t, const std::string& fakes);

}  // namespace sapipe::tests
