#include "models/gpt/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/path_check.h"
#include "common/unique_fd.h"

namespace strata::engine {

Result<TokenFile::Width> parse_token_width(std::string_view text) {
  if (text == "uint8") return TokenFile::Width::kU8;
  if (text == "uint16") return TokenFile::Width::kU16;
  if (text == "uint32") return TokenFile::Width::kU32;
  return invalid_argument("token type \"" + std::string(text) + "\" is not one of uint8, uint16, uint32");
}

Result<TokenFile> TokenFile::open(const std::string& path, Width width, int64_t seq) {
  if (seq < 1) return invalid_argument("token file " + path + ": seq must be >= 1");
  STRATA_RETURN_IF_ERROR(check_input_file(path, "token file"));  // a directory or FIFO would hang or fail mmap
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno_status(errno, "token file " + path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_status(errno, "token file " + path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const int w = static_cast<int>(width);
  if (size % static_cast<uint64_t>(w) != 0) {
    return invalid_argument("token file " + path + ": " + std::to_string(size) + " bytes is not a whole number of " +
                            std::to_string(w) + "-byte tokens");
  }
  const int64_t n = static_cast<int64_t>(size / static_cast<uint64_t>(w));
  if (n < seq + 1) {
    return invalid_argument("token file " + path + " holds " + std::to_string(n) + " tokens; a sequence of " +
                            std::to_string(seq) + " needs " + std::to_string(seq + 1));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) return errno_status(errno, "token file " + path + ": mmap");
  (void)::madvise(map, size, MADV_SEQUENTIAL);  // advice only
  TokenFile f;
  f.path_ = path;
  f.data_ = static_cast<const unsigned char*>(map);
  f.size_bytes_ = size;
  f.width_ = w;
  f.tokens_ = n;
  f.seq_ = seq;
  return f;
}

TokenFile::TokenFile(TokenFile&& other) noexcept { *this = std::move(other); }

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_bytes_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    width_ = other.width_;
    tokens_ = other.tokens_;
    seq_ = other.seq_;
  }
  return *this;
}

TokenFile::~TokenFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_bytes_);
}

int64_t TokenFile::token_at(int64_t i) const {
  const unsigned char* p = data_ + static_cast<uint64_t>(i) * static_cast<uint64_t>(width_);
  uint32_t v = 0;
  for (int k = width_ - 1; k >= 0; --k) v = (v << 8) | p[k];  // little-endian
  return v;
}

Status TokenFile::micro_batch(int64_t index, int64_t batch, int64_t vocab, std::span<int32_t> tokens_out,
                              std::span<int32_t> targets_out) const {
  const uint64_t n = static_cast<uint64_t>(batch * seq_);
  if (index < 0 || batch < 1 || tokens_out.size() != n || targets_out.size() != n) {
    return invalid_argument("token file: micro-batch " + std::to_string(index) + " of " + std::to_string(batch) +
                            " x " + std::to_string(seq_) + " into buffers of " + std::to_string(tokens_out.size()) +
                            " and " + std::to_string(targets_out.size()));
  }
  // Window starts advance by seq and wrap over the tokens - seq starts that
  // leave room for a window's seq + 1 tokens (the product in 128 bits: a
  // long run over a big file passes 2^64).
  const unsigned __int128 starts = static_cast<unsigned __int128>(tokens_ - seq_);
  for (int64_t b = 0; b < batch; ++b) {
    const unsigned __int128 row =
        static_cast<unsigned __int128>(index) * static_cast<uint64_t>(batch) + static_cast<uint64_t>(b);
    const int64_t start = static_cast<int64_t>(row * static_cast<uint64_t>(seq_) % starts);
    for (int64_t t = 0; t <= seq_; ++t) {
      const int64_t v = token_at(start + t);
      if (v >= vocab) {
        return invalid_argument("token file " + path_ + ": token " + std::to_string(v) + " at token offset " +
                                std::to_string(start + t) + " is outside the model's vocabulary of " +
                                std::to_string(vocab));
      }
      const size_t at = static_cast<size_t>(b * seq_ + t);
      if (t < seq_) tokens_out[at] = static_cast<int32_t>(v);
      if (t > 0) targets_out[at - 1] = static_cast<int32_t>(v);
    }
  }
  return ok_status();
}

}  // namespace strata::engine
