// MemoryBudget: the hard byte budget every Device enforces, in one place.
// charge() reserves bytes or fails with ResourceExhausted naming the budget,
// the request and what is in use; release() returns them; the high-water
// mark is kept for the planner's prediction check. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata::gpu {

class MemoryBudget {
 public:
  // `label` names the budget in errors ("device memory", "device memory on cuda:0 (H200)").
  MemoryBudget(uint64_t capacity_bytes, std::string label)
      : capacity_(capacity_bytes), label_(std::move(label)) {}

  Status charge(uint64_t bytes, std::string_view what);
  void release(uint64_t bytes);

  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t used_bytes() const;
  uint64_t peak_bytes() const;

 private:
  const uint64_t capacity_;
  const std::string label_;
  mutable std::mutex mu_;
  uint64_t used_ = 0;
  uint64_t peak_ = 0;
};

}  // namespace strata::gpu
