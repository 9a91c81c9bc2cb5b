#include "tests/test_util.h"

#include <gtest/gtest.h>
#include <linux/io_uring.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace strata::testing {

uint64_t test_seed(uint64_t fallback) {
  uint64_t seed = fallback;
  if (const char* env = std::getenv("STRATA_TEST_SEED")) seed = std::strtoull(env, nullptr, 0);
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::printf("[ seed     ] %llu (replay with STRATA_TEST_SEED=%llu)\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  return seed;
}

TempDir::TempDir(const std::string& parent) {
  std::string base = parent;
  if (base.empty()) {
    const char* env = std::getenv("STRATA_TEST_DIR");
    base = env != nullptr ? env : "/tmp";
  }
  std::string templ = base + "/strata-test-XXXXXX";
  char* made = ::mkdtemp(templ.data());
  if (made == nullptr) {
    ADD_FAILURE() << "mkdtemp in " << base << ": " << std::strerror(errno);
    return;
  }
  path_ = made;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::sub(const std::string& name) const {
  std::string p = path_ + "/" + name;
  std::filesystem::create_directories(p);
  return p;
}

namespace {
uint64_t stamp(uint64_t word_offset, uint64_t base, uint64_t seed) {
  return ((word_offset + base) ^ seed) * 0x9E3779B97F4A7C15ull + 1;
}
}  // namespace

void fill_stamped(std::byte* data, uint64_t size_bytes, uint64_t base, uint64_t seed) {
  for (uint64_t off = 0; off < size_bytes; off += 8) {
    uint64_t word = stamp(off, base, seed);
    std::memcpy(data + off, &word, std::min<uint64_t>(8, size_bytes - off));
  }
}

std::string check_stamped(const std::byte* data, uint64_t size_bytes, uint64_t base, uint64_t seed) {
  std::string out;
  int shown = 0;
  for (uint64_t off = 0; off < size_bytes; off += 8) {
    uint64_t word = stamp(off, base, seed);
    uint64_t n = std::min<uint64_t>(8, size_bytes - off);
    if (std::memcmp(data + off, &word, n) == 0) continue;
    if (shown++ < 4) {
      uint64_t got = 0;
      std::memcpy(&got, data + off, n);
      char buf[160];
      std::snprintf(buf, sizeof(buf), "byte offset %llu: got %016llx want %016llx; ", static_cast<unsigned long long>(off),
                    static_cast<unsigned long long>(got), static_cast<unsigned long long>(word));
      out += buf;
    }
  }
  if (shown > 4) out += "(" + std::to_string(shown) + " mismatching words in " + std::to_string(size_bytes) + " bytes)";
  return out;
}

bool uring_available(std::string* why) {
  io_uring_params params{};
  long fd = ::syscall(__NR_io_uring_setup, 4, &params);
  if (fd < 0) {
    if (why) *why = std::string("io_uring_setup refused: ") + std::strerror(errno);
    return false;
  }
  ::close(static_cast<int>(fd));
  return true;
}

bool is_root() { return ::geteuid() == 0; }

SmallDisk::SmallDisk(const std::string& dir, uint64_t size_bytes) : mount_point_(dir + "/mnt") {
  if (!is_root()) {
    skip_reason_ = "needs root to loop-mount an ext4 image";
    return;
  }
  const std::string image = dir + "/small.img";
  const std::string mkfs = "mkdir -p " + mount_point_ + " && truncate -s " + std::to_string(size_bytes) + " " + image +
                           " && mkfs.ext4 -q -F -m 0 " + image + " >/dev/null 2>&1";
  if (std::system(mkfs.c_str()) != 0) {
    skip_reason_ = "mkfs.ext4 not available";
    return;
  }
  if (std::system(("mount -o loop " + image + " " + mount_point_ + " 2>/dev/null").c_str()) != 0) {
    skip_reason_ = "loop mount refused here (no loop devices or no CAP_SYS_ADMIN)";
    return;
  }
  mounted_ = true;
}

SmallDisk::~SmallDisk() {
  if (mounted_ && ::umount(mount_point_.c_str()) != 0) {
    std::fprintf(stderr, "SmallDisk: umount %s: %s\n", mount_point_.c_str(), std::strerror(errno));
  }
}

}  // namespace strata::testing
