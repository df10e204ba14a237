// One instruction set's kernels: the FWHT and the sin/cos pair. setup.py compiles this file once
// per instruction set, each time with RFJAX_ISA (the namespace) and that instruction set's
// compiler flags; fwht_cpu.cc chooses among the compiled ones at load time.
#include "fwht_kernel.h"
#include "sincos_kernel.h"
