// The cpu_optim vector kernels instantiated for avx512; this file alone is
// compiled with avx512's instruction-set flags (see CMakeLists.txt).
#include "cpu_optim/kernels_impl.h"

STRATA_CPU_OPTIM_INSTANTIATE(xsimd::avx512bw)
