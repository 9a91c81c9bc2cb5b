// cpu_optim's element types: the shared DType (common/dtype.h) and how
// optimizer states are stored.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/dtype.h"
#include "common/status.h"

namespace strata::cpu_optim {

using strata::bf16_to_f32;
using strata::DType;
using strata::dtype_bytes;
using strata::dtype_name;
using strata::f16_to_f32;
using strata::f32_to_bf16;
using strata::f32_to_f16;

// How optimizer states (Adam m and v) are stored. kQ8: 8-bit blockwise
// quantised, one fp32 scale per kQ8BlockElems elements (see q8.h).
enum class StateType : uint8_t { kF32, kBF16, kQ8 };

inline constexpr int64_t kQ8BlockElems = 256;

// grad_stats() sums the gradient's squares in partials of this many
// elements (fixed, so the sum has the same bits for any tiling).
inline constexpr int64_t kGradStatsPartialElems = 1024;

// Bytes of one state element (q8: the code; its block scales are apart).
constexpr uint64_t state_elem_bytes(StateType t) {
  return t == StateType::kF32 ? 4 : (t == StateType::kBF16 ? 2 : 1);
}

std::string_view state_type_name(StateType t);
// The inverse of state_type_name ("fp32", "bf16", "q8"); InvalidArgument
// naming the allowed names otherwise.
Result<StateType> parse_state_type(std::string_view name);

// Bytes of Adam's m and v together per parameter, block scales included
// on average: 8 (fp32), 4 (bf16), 2 + 8/256 (q8).
constexpr double adam_state_bytes_per_param(StateType t) {
  return 2.0 * (static_cast<double>(state_elem_bytes(t)) + (t == StateType::kQ8 ? 4.0 / kQ8BlockElems : 0.0));
}

}  // namespace strata::cpu_optim
