// The CPU optimizer benchmarks' modes (strata-adambench and
// strata-cpu-optim-gbench): which streams AdamW reads and writes, and how
// many bytes per parameter that moves.
#pragma once

#include <string_view>

#include "cpu_optim/dtype.h"

namespace strata::bench {

struct AdamMode {
  std::string_view name;
  cpu_optim::DType grad;
  cpu_optim::StateType state;
  bool out;  // a bf16 copy of the new weights written
};

// offload: bf16 gradients in, fp32 master/m/v, bf16 weights out; fp32: fp32
// gradients and states, no copy out; bf16_state, q8_state: offload with
// bf16 / 8-bit blockwise m and v.
inline constexpr AdamMode kAdamModes[] = {
    {"offload", cpu_optim::DType::kBF16, cpu_optim::StateType::kF32, true},
    {"fp32", cpu_optim::DType::kF32, cpu_optim::StateType::kF32, false},
    {"bf16_state", cpu_optim::DType::kBF16, cpu_optim::StateType::kBF16, true},
    {"q8_state", cpu_optim::DType::kBF16, cpu_optim::StateType::kQ8, true},
};

// Bytes read plus written per parameter: p read and written, g read, m and v
// read and written, the weights copy written; the q8 block scales too.
inline double adam_bytes_per_param(const AdamMode& m) {
  double b = 8 + static_cast<double>(cpu_optim::dtype_bytes(m.grad)) +
             4.0 * static_cast<double>(cpu_optim::state_elem_bytes(m.state)) + (m.out ? 2 : 0);
  if (m.state == cpu_optim::StateType::kQ8) b += 2.0 * 2 * 4 / cpu_optim::kQ8BlockElems;
  return b;
}

}  // namespace strata::bench
