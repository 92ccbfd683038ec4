// The core clock the CPU kernels run at, measured: for the peak FLOP/s that `sapipe bench gemm`
// compares against (the addon's measureClockGhz).
#pragma once

namespace sapipe {

// The clock in GHz from a chain of dependent integer multiplies (3 cycles each on every x86-64
// core since Nehalem) timed for about 20 ms, the best of three. /proc/cpuinfo reports the nominal
// clock on virtual machines, not the turbo clock the kernels run at. 0 where it cannot measure
// (not x86-64).
double measure_cpu_clock_ghz();

}  // namespace sapipe
