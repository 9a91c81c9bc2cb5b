#include "common/dtype.h"

namespace strata {

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (name == dtype_name(t)) return t;
  }
  return std::nullopt;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}

}  // namespace strata
