// The cpu_optim vector kernels instantiated for avx2; this file alone is
// compiled with avx2's instruction-set flags (see CMakeLists.txt).
#include "cpu_optim/kernels_impl.h"

STRATA_CPU_OPTIM_INSTANTIATE(xsimd::fma3<xsimd::avx2>)
