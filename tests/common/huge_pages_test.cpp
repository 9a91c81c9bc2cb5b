// Big buffers land on 2 MiB boundaries and in memory the kernel may back
// with transparent huge pages (the VMA's THPeligible flag in smaps); small
// ones keep their 64-byte alignment and no advice.
#include "common/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/aligned_vector.h"
#include "io/buffer.h"

namespace strata {
namespace {

// THPeligible of the mapping that holds `p` (-1: not found).
int thp_eligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = at >= lo && at < hi;
      continue;
    }
    int eligible = 0;
    if (inside && std::sscanf(line.c_str(), "THPeligible: %d", &eligible) == 1) return eligible;
  }
  return -1;
}

// The kernel's THP setting ("always [madvise] never"), or "" without THP.
std::string thp_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(f, mode);
  return mode;
}

// Why the kernel would not take the advice here, or "".
std::string thp_unavailable() {
  const std::string mode = thp_mode();
  if (mode.empty()) return "this kernel has no transparent huge pages";
  if (mode.find("[never]") != std::string::npos) return "transparent huge pages are set to never";
  if (!huge_pages_enabled()) return "STRATA_HUGE_PAGES=0";
  return "";
}

TEST(HugePages, BigBuffersAreAlignedAndSmallOnesAreNot) {
  if (!huge_pages_enabled()) GTEST_SKIP() << "STRATA_HUGE_PAGES=0";
  EXPECT_EQ(bulk_alignment(kHugePageBytes, 64), kHugePageBytes);
  EXPECT_EQ(bulk_alignment(kHugePageBytes - 1, 64), 64u);
  EXPECT_EQ(bulk_alignment(kHugePageBytes, 4096), kHugePageBytes);
  EXPECT_EQ(bulk_alignment(64 << 20, 1ull << 30), 1ull << 30);  // a larger alignment asked for stays
  AlignedVector<float> big(3 << 20);  // 12 MiB
  AlignedVector<float> small(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % kHugePageBytes, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
  Result<io::Buffer> buffer = io::allocate_aligned(5 << 20);
  ASSERT_TRUE(buffer) << buffer.error().to_string();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % kHugePageBytes, 0u);
  EXPECT_FALSE(advise_huge_pages(small.data(), 4000));
  EXPECT_FALSE(advise_huge_pages(reinterpret_cast<std::byte*>(big.data()) + 4096, 4 << 20));  // not 2 MiB-aligned
}

TEST(HugePages, BigBuffersAreAdvised) {
  const std::string why = thp_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  AlignedVector<std::byte> v(16 << 20);
  Result<io::Buffer> buffer = io::allocate_aligned(6 << 20);
  ASSERT_TRUE(buffer) << buffer.error().to_string();
  const int eligible = thp_eligible(v.data() + (8 << 20));
  if (eligible < 0) GTEST_SKIP() << "this kernel's /proc/self/smaps shows no THPeligible";
  EXPECT_EQ(eligible, 1);
  EXPECT_EQ(thp_eligible(buffer->data() + (2 << 20)), 1);
  // Where THP waits for the advice (madvise), memory without it is not
  // eligible: the flag shows the advice, not the system's default.
  if (thp_mode().find("[madvise]") != std::string::npos) {
    void* plain = std::aligned_alloc(kHugePageBytes, 16 << 20);
    ASSERT_NE(plain, nullptr);
    std::memset(plain, 1, 16 << 20);
    EXPECT_EQ(thp_eligible(static_cast<std::byte*>(plain) + (8 << 20)), 0);
    std::free(plain);
  }
}

}  // namespace
}  // namespace strata
