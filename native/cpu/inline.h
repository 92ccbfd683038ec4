#pragma once
// Kernel bodies are force-inlined into one wrapper per instruction set (kernel_table.cpp), where
// the compiler vectorises them for that set. They must not be called from anywhere else.
#define SAPIPE_KERNEL_BODY static inline __attribute__((always_inline))
