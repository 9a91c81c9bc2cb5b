#include "io/file.h"

#include <gtest/gtest.h>
#include <filesystem>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>

#include "common/units.h"
#include "tests/test_util.h"

namespace strata::io {
namespace {

TEST(File, OpensDirectWithQueriedAlignment) {
  strata::testing::TempDir dir;
  Result<File> f = File::open(dir.path() + "/a.bin", FileOptions{});
  ASSERT_TRUE(f) << f.error().to_string();
  EXPECT_TRUE(f->direct());
  EXPECT_GE(f->alignment(), 4096u);
  EXPECT_TRUE(is_power_of_two(f->alignment()));
  ASSERT_TRUE(f->allocate(0, 1 << 20).ok());
  EXPECT_EQ(*f->size_bytes(), 1u << 20);
  EXPECT_TRUE(f->close().ok());
}

TEST(File, MissingDirectoryIsNotFound) {
  Result<File> f = File::open("/nonexistent-strata-dir/x.bin", FileOptions{});
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().code(), StatusCode::kNotFound);
  EXPECT_NE(f.error().message().find("/nonexistent-strata-dir/x.bin"), std::string::npos);
}

// tmpfs has no O_DIRECT: refused with a message that says so, or opened
// buffered when the caller allows it.
TEST(File, TmpfsRefusedOrBuffered) {
  struct statfs fs {};
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) GTEST_SKIP() << "/dev/shm is not a tmpfs here";
  strata::testing::TempDir dir("/dev/shm");
  Result<File> refused = File::open(dir.path() + "/a.bin", FileOptions{});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.error().message().find("O_DIRECT"), std::string::npos) << refused.error().to_string();
  Result<File> buffered = File::open(dir.path() + "/a.bin", FileOptions{true, true, DirectMode::kPrefer});
  ASSERT_TRUE(buffered) << buffered.error().to_string();
  EXPECT_FALSE(buffered->direct());
}

TEST(File, ReadOnlyDirectoryIsFailedPrecondition) {
  if (strata::testing::is_root()) GTEST_SKIP() << "root ignores directory permissions";
  strata::testing::TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0500), 0);
  Result<File> f = File::open(dir.path() + "/a.bin", FileOptions{});
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().code(), StatusCode::kFailedPrecondition);
}

// check_directory: what a config's NVMe directory must be, asked before any
// work; the probe files it makes are gone after.
TEST(File, CheckDirectoryNamesWhatIsWrong) {
  strata::testing::TempDir dir;
  EXPECT_TRUE(check_directory(dir.path(), DirectMode::kRequire).ok());
  Status missing = check_directory(dir.path() + "/missing", DirectMode::kRequire);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find(dir.path() + "/missing"), std::string::npos) << missing.to_string();
  ASSERT_TRUE(File::open(dir.path() + "/plain", FileOptions{}));
  EXPECT_FALSE(check_directory(dir.path() + "/plain", DirectMode::kRequire).ok());
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) entries += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(entries, 1);  // "plain" only: no probe file left
  struct statfs fs {};
  if (::statfs("/dev/shm", &fs) == 0 && fs.f_type == TMPFS_MAGIC) {
    strata::testing::TempDir shm("/dev/shm");
    Status tmpfs = check_directory(shm.path(), DirectMode::kRequire);
    EXPECT_EQ(tmpfs.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(tmpfs.message().find("O_DIRECT"), std::string::npos) << tmpfs.to_string();
    EXPECT_TRUE(check_directory(shm.path(), DirectMode::kPrefer).ok());
  }
}

}  // namespace
}  // namespace strata::io
