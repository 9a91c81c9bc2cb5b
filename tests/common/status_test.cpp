#include "common/status.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "common/units.h"

namespace strata {
namespace {

TEST(Status, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.to_string(), "OK");
  EXPECT_FALSE(s.retryable());
}

TEST(Status, CarriesCodeMessageAndContext) {
  Status s = resource_exhausted("budget full");
  EXPECT_FALSE(s.ok());
  Status c = s.with_context("write blob 'x'");
  EXPECT_EQ(c.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(c.message(), "write blob 'x': budget full");
  EXPECT_EQ(c.to_string(), "RESOURCE_EXHAUSTED: write blob 'x': budget full");
  EXPECT_EQ(s.message(), "budget full");  // the original is untouched
}

TEST(Status, ErrnoTable) {
  EXPECT_EQ(errno_status(ENOSPC, "w").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(errno_status(ENOENT, "o").code(), StatusCode::kNotFound);
  EXPECT_EQ(errno_status(EACCES, "o").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(errno_status(EINVAL, "o").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(errno_status(EIO, "r").code(), StatusCode::kUnavailable);
  EXPECT_FALSE(errno_status(EIO, "r").retryable());
  EXPECT_TRUE(errno_status(EAGAIN, "r").retryable());
  EXPECT_EQ(errno_status(EPIPE, "r").code(), StatusCode::kInternal);
  std::string m(errno_status(ENOSPC, "write /x").message());
  EXPECT_NE(m.find("write /x"), std::string::npos);
  EXPECT_NE(m.find("ENOSPC"), std::string::npos);
  EXPECT_FALSE(std::move(errno_status(EAGAIN, "r")).final_error().retryable());
}

Result<int> half(int x) {
  if (x % 2 != 0) return invalid_argument(std::to_string(x) + " is odd");
  return x / 2;
}

Result<int> quarter(int x) {
  STRATA_ASSIGN_OR_RETURN(int h, half(x));
  STRATA_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

Status check_even(int x) {
  STRATA_RETURN_IF_ERROR_CTX(half(x).status(), "check_even");
  return ok_status();
}

TEST(Result, PropagatesValuesAndErrors) {
  Result<int> ok = quarter(8);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(*ok, 2);
  Result<int> bad = quarter(6);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.error().message(), "3 is odd");
  EXPECT_TRUE(check_even(4).ok());
  EXPECT_EQ(check_even(3).message(), "check_even: 3 is odd");
}

TEST(ResultDeathTest, ValueOnErrorAborts) {
  Result<int> bad = half(3);
  EXPECT_DEATH((void)bad.value(), "Result::value\\(\\) on an error");
}

TEST(Units, ParseAndFormat) {
  uint64_t v = 0;
  EXPECT_TRUE(parse_bytes("4GiB", &v));
  EXPECT_EQ(v, 4 * kGiB);
  EXPECT_TRUE(parse_bytes("128k", &v));
  EXPECT_EQ(v, 128 * kKiB);
  EXPECT_TRUE(parse_bytes("4096", &v));
  EXPECT_EQ(v, 4096u);
  EXPECT_FALSE(parse_bytes("", &v));
  EXPECT_FALSE(parse_bytes("12q", &v));
  EXPECT_FALSE(parse_bytes("99999999999999999999", &v));
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 * kMiB / 2), "1.50 MiB");
  EXPECT_EQ(round_up(4097, 4096), 8192u);
  EXPECT_TRUE(is_aligned(8192, 4096));
  EXPECT_FALSE(is_aligned(8193, 4096));
}

}  // namespace
}  // namespace strata
