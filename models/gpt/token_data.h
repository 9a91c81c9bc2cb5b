// A file of training tokens: a flat array of little-endian unsigned
// integers (uint16 as nanoGPT's train.bin, uint32 for larger vocabularies,
// or uint8: raw bytes, a byte-level model of any file), mapped read-only.
// Batches walk it in order: micro-batch m's row b is the window of seq + 1
// tokens starting at ((m * batch + b) * seq) mod (tokens - seq), its first
// seq tokens the input and its last seq the targets — so a run's data is a
// function of the micro-batch index alone, and a resumed run (index =
// steps x grad_accum) reads what the uninterrupted one would have.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata::engine {

class TokenFile {
 public:
  enum class Width { kU8 = 1, kU16 = 2, kU32 = 4 };

  // NotFound / InvalidArgument naming the file: missing, empty, a size that
  // is not a whole number of tokens, or fewer than seq + 1 tokens.
  static Result<TokenFile> open(const std::string& path, Width width, int64_t seq);
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  int64_t tokens() const { return tokens_; }
  // Micro-batch `index` (batch x seq tokens and as many targets, row-major)
  // into `tokens_out` / `targets_out`. InvalidArgument, naming the token's
  // place in the file, for a token at or above `vocab`.
  Status micro_batch(int64_t index, int64_t batch, int64_t vocab, std::span<int32_t> tokens_out,
                     std::span<int32_t> targets_out) const;

 private:
  TokenFile() = default;
  int64_t token_at(int64_t i) const;

  std::string path_;
  const unsigned char* data_ = nullptr;  // the mapping
  uint64_t size_bytes_ = 0;
  int width_ = 2;
  int64_t tokens_ = 0, seq_ = 0;
};

// "uint8" | "uint16" | "uint32"
Result<TokenFile::Width> parse_token_width(std::string_view text);

}  // namespace strata::engine
