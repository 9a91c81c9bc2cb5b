#include "common/huge_pages.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "common/units.h"

namespace strata {

bool huge_pages_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("STRATA_HUGE_PAGES");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

uint64_t bulk_alignment(uint64_t bytes, uint64_t base) {
  return huge_pages_enabled() && bytes >= kHugePageBytes && base < kHugePageBytes ? kHugePageBytes : base;
}

bool advise_huge_pages(void* data, uint64_t bytes) {
  if (!huge_pages_enabled() || bytes < kHugePageBytes) return false;
  if (reinterpret_cast<uintptr_t>(data) % kHugePageBytes != 0) return false;
  // A hint: a kernel without THP refuses it (EINVAL) and keeps small pages.
  return ::madvise(data, round_down(bytes, 4096), MADV_HUGEPAGE) == 0;
}

}  // namespace strata
