#include "gpu/memory_budget.h"

#include <algorithm>

#include "common/units.h"

namespace strata::gpu {

Status MemoryBudget::charge(uint64_t bytes, std::string_view what) {
  std::lock_guard lock(mu_);
  if (used_ + bytes > capacity_) {
    return resource_exhausted(label_ + " budget of " + format_bytes(capacity_) + " exceeded: " + std::string(what) +
                              " needs " + format_bytes(bytes) + " with " + format_bytes(used_) + " in use");
  }
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  return ok_status();
}

void MemoryBudget::release(uint64_t bytes) {
  std::lock_guard lock(mu_);
  STRATA_CHECK_MSG(bytes <= used_, "releasing more device memory than was charged");
  used_ -= bytes;
}

uint64_t MemoryBudget::used_bytes() const {
  std::lock_guard lock(mu_);
  return used_;
}

uint64_t MemoryBudget::peak_bytes() const {
  std::lock_guard lock(mu_);
  return peak_;
}

}  // namespace strata::gpu
