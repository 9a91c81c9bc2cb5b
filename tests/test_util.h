// Helpers shared by the tests: seeds (printed; STRATA_TEST_SEED replays one),
// temporary directories on a real filesystem, and offset-stamped data so a
// mismatch names the exact byte that moved (STYLE.md §6).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::testing {

// The seed for this test: STRATA_TEST_SEED if set, else `fallback`. Printed
// as a gtest property so a failure can be replayed.
uint64_t test_seed(uint64_t fallback);

// A fresh directory under $STRATA_TEST_DIR or /tmp (must support O_DIRECT),
// removed with its contents by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& parent = "");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const;  // creates path/name

 private:
  std::string path_;
};

// Each 8-byte word holds (its byte offset + base) ^ seed; a tail shorter than
// a word holds that word's leading bytes.
void fill_stamped(std::byte* data, uint64_t size_bytes, uint64_t base, uint64_t seed);
// Returns "" when equal, else a description of the first mismatches.
std::string check_stamped(const std::byte* data, uint64_t size_bytes, uint64_t base, uint64_t seed);

// True when this process may create an io_uring (not refused by seccomp/sysctl).
bool uring_available(std::string* why);
bool is_root();

}  // namespace strata::testing
