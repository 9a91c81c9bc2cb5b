// Helpers shared by the tests: seeds (printed; STRATA_TEST_SEED replays one),
// temporary directories on a real filesystem, and offset-stamped data so a
// mismatch names the exact byte that moved.
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

// A small ext4 filesystem on a loop device, mounted at `dir`/mnt and
// unmounted by the destructor: a real full disk (no blocks reserved for
// root, so statvfs's f_bfree is what a writer gets). Needs root, mkfs.ext4 and a
// loop device; skip_reason() says which is missing ("" when mounted).
class SmallDisk {
 public:
  SmallDisk(const std::string& dir, uint64_t size_bytes);
  ~SmallDisk();
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  const std::string& skip_reason() const { return skip_reason_; }
  const std::string& mount_point() const { return mount_point_; }

 private:
  std::string mount_point_, skip_reason_;
  bool mounted_ = false;
};

}  // namespace strata::testing
