// cpu_optim's element types: the shared DType (common/dtype.h) and how
// optimizer states are stored.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/dtype.h"

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

// Bytes of one state element (q8: the code; its block scales are apart).
constexpr uint64_t state_elem_bytes(StateType t) {
  return t == StateType::kF32 ? 4 : (t == StateType::kBF16 ? 2 : 1);
}

std::string_view state_type_name(StateType t);

}  // namespace strata::cpu_optim
