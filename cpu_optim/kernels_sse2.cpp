// The cpu_optim vector kernels instantiated for sse2; this file alone is
// compiled with sse2's instruction-set flags (see CMakeLists.txt).
#include "cpu_optim/kernels_impl.h"

STRATA_CPU_OPTIM_INSTANTIATE(xsimd::sse2)
