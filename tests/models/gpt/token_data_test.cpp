// Token files: little-endian tokens of 1, 2 or 4 bytes, batches that walk the
// file in order and wrap, and refusals that name the file and the token.
#include "models/gpt/token_data.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace strata::engine {
namespace {

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Tokens 0..n-1 as little-endian uint16.
void write_u16(const std::string& path, int n) {
  std::vector<unsigned char> b;
  for (int i = 0; i < n; ++i) {
    b.push_back(static_cast<unsigned char>(i & 0xff));
    b.push_back(static_cast<unsigned char>(i >> 8));
  }
  write_bytes(path, b);
}

TEST(TokenFile, BatchesWalkTheFileInOrderAndWrap) {
  strata::testing::TempDir dir;
  const std::string path = dir.path() + "/t.bin";
  write_u16(path, 11);
  Result<TokenFile> f = TokenFile::open(path, TokenFile::Width::kU16, 4);
  ASSERT_TRUE(f) << f.error().to_string();
  EXPECT_EQ(f->tokens(), 11);
  std::vector<int32_t> x(8), y(8);
  ASSERT_TRUE(f->micro_batch(0, 2, 100, x, y).ok());
  EXPECT_EQ(x, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(y, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  // Rows 2 and 3 start at 8 and 12, wrapped over the 11 - 4 = 7 starts.
  ASSERT_TRUE(f->micro_batch(1, 2, 100, x, y).ok());
  EXPECT_EQ(x, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(y, (std::vector<int32_t>{2, 3, 4, 5, 6, 7, 8, 9}));
  // A far index stays inside the file (no overflow of index x batch x seq).
  ASSERT_TRUE(f->micro_batch(int64_t{1} << 62, 2, 100, x, y).ok());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], x[i] + 1);
}

TEST(TokenFile, EveryWidthIsLittleEndian) {
  strata::testing::TempDir dir;
  write_bytes(dir.path() + "/u8", {7, 200, 3});
  write_bytes(dir.path() + "/u16", {0x02, 0x01, 0xff, 0x00, 0x00, 0x80});
  write_bytes(dir.path() + "/u32", {0x04, 0x03, 0x02, 0x01, 0x01, 0, 0, 0, 0, 0, 0, 0});
  std::vector<int32_t> x(2), y(2);
  Result<TokenFile> u8 = TokenFile::open(dir.path() + "/u8", TokenFile::Width::kU8, 2);
  ASSERT_TRUE(u8);
  ASSERT_TRUE(u8->micro_batch(0, 1, 256, x, y).ok());
  EXPECT_EQ(x, (std::vector<int32_t>{7, 200}));
  EXPECT_EQ(y, (std::vector<int32_t>{200, 3}));
  Result<TokenFile> u16 = TokenFile::open(dir.path() + "/u16", TokenFile::Width::kU16, 2);
  ASSERT_TRUE(u16);
  ASSERT_TRUE(u16->micro_batch(0, 1, 1 << 16, x, y).ok());
  EXPECT_EQ(x, (std::vector<int32_t>{0x0102, 0xff}));
  EXPECT_EQ(y, (std::vector<int32_t>{0xff, 0x8000}));
  Result<TokenFile> u32 = TokenFile::open(dir.path() + "/u32", TokenFile::Width::kU32, 2);
  ASSERT_TRUE(u32);
  ASSERT_TRUE(u32->micro_batch(0, 1, int64_t{1} << 31, x, y).ok());
  EXPECT_EQ(x, (std::vector<int32_t>{0x01020304, 1}));
  EXPECT_EQ(y, (std::vector<int32_t>{1, 0}));
}

TEST(TokenFile, BadFilesAndTokensAreNamed) {
  strata::testing::TempDir dir;
  Result<TokenFile> missing = TokenFile::open(dir.path() + "/none", TokenFile::Width::kU16, 4);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.error().message().find(dir.path() + "/none"), std::string::npos);
  write_bytes(dir.path() + "/odd", {1, 2, 3});
  Result<TokenFile> odd = TokenFile::open(dir.path() + "/odd", TokenFile::Width::kU16, 1);
  ASSERT_FALSE(odd);
  EXPECT_NE(odd.error().message().find("3 bytes is not a whole number of 2-byte tokens"), std::string::npos)
      << odd.error().to_string();
  write_u16(dir.path() + "/short", 4);
  Result<TokenFile> shrt = TokenFile::open(dir.path() + "/short", TokenFile::Width::kU16, 4);
  ASSERT_FALSE(shrt);
  EXPECT_NE(shrt.error().message().find("holds 4 tokens; a sequence of 4 needs 5"), std::string::npos)
      << shrt.error().to_string();
  write_u16(dir.path() + "/big", 40);
  Result<TokenFile> f = TokenFile::open(dir.path() + "/big", TokenFile::Width::kU16, 4);
  ASSERT_TRUE(f);
  std::vector<int32_t> x(8), y(8);
  Status s = f->micro_batch(0, 2, 8, x, y);  // tokens 0..8: token 8 is outside a vocabulary of 8
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token 8 at token offset 8 is outside the model's vocabulary of 8"), std::string::npos)
      << s.to_string();
  std::vector<int32_t> small(3);
  EXPECT_EQ(f->micro_batch(0, 2, 100, small, y).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(parse_token_width("int16"));
  EXPECT_EQ(*parse_token_width("uint32"), TokenFile::Width::kU32);
}

}  // namespace
}  // namespace strata::engine
