#include "engine/checkpoint_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <optional>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>
#include <xxhash.h>

namespace strata::engine {
namespace {

std::string_view st_dtype(TensorType t) {
  switch (t) {
    case TensorType::kF32: return "F32";
    case TensorType::kBF16: return "BF16";
    case TensorType::kF16: return "F16";
    case TensorType::kU8: return "U8";
  }
  return "?";
}

std::optional<TensorType> dtype_from(const nlohmann::json& v) {
  const std::string s = v.is_string() ? v.get<std::string>() : "";
  if (s == "F32") return TensorType::kF32;
  if (s == "BF16") return TensorType::kBF16;
  if (s == "F16") return TensorType::kF16;
  if (s == "U8") return TensorType::kU8;
  return std::nullopt;
}

// The header's JSON text, padded with spaces so the data starts 8-byte
// aligned, as the format recommends.
std::string header_text(const std::vector<TensorInfo>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorInfo& t : tensors) {
    header[t.name] = {{"dtype", st_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  std::string text = header.dump();
  text.append((8 - (text.size() % 8)) % 8, ' ');
  return text;
}

std::array<unsigned char, 8> little_endian(uint64_t v) {
  std::array<unsigned char, 8> le{};
  for (int i = 0; i < 8; ++i) le[static_cast<size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
  return le;
}

// The xxh3-64 of the header as it lies in the file: its length, then its text.
uint64_t header_digest_of(const std::string& text) {
  const std::array<unsigned char, 8> le = little_endian(text.size());
  std::string bytes(reinterpret_cast<const char*>(le.data()), le.size());
  bytes += text;
  return XXH3_64bits(bytes.data(), bytes.size());
}

// 16 hex digits back to a value; false for anything else.
bool parse_hex64(const std::string& text, uint64_t* out) {
  if (text.size() != 16) return false;
  uint64_t v = 0;
  for (char ch : text) {
    const int d = ch >= '0' && ch <= '9' ? ch - '0' : (ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1);
    if (d < 0) return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

// Pieces of this many bytes: what verify() and the read-back hash stream.
constexpr uint64_t kVerifyPieceBytes = uint64_t{8} << 20;

Status write_all(int fd, const void* data, uint64_t bytes, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(errno, "write " + path);
    p += n;
    bytes -= static_cast<uint64_t>(n);
  }
  return ok_status();
}

Status pwrite_all(int fd, const void* data, uint64_t bytes, uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(errno, "write " + path);
    p += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return ok_status();
}

Status fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "open " + path + " for fsync");
  UniqueFd owner(fd);
  if (::fsync(fd) != 0) return errno_status(errno, "fsync " + path);
  return owner.close();
}

// A complete checkpoint's directory name: step-<N>, or step-<N>.r<k> for a
// step saved again; false for anything else (a .tmp among them).
bool parse_checkpoint_name(const std::string& name, int64_t* step, int64_t* resave) {
  if (name.rfind("step-", 0) != 0) return false;
  char* end = nullptr;
  const long long n = std::strtoll(name.c_str() + 5, &end, 10);
  if (end == name.c_str() + 5 || n < 0) return false;
  long long k = 0;
  if (end[0] == '.' && end[1] == 'r') {
    char* rend = nullptr;
    k = std::strtoll(end + 2, &rend, 10);
    if (rend == end + 2) return false;
    end = rend;
  }
  if (*end != '\0') return false;
  *step = n;
  *resave = k;
  return true;
}

// Direct writes: whole blocks of this size (the largest logical block
// size in use), at least kDirectMinBytes of them in one write, staged
// through a bounce buffer of kDirectBounceBytes.
constexpr uint64_t kDirectBlock = 4096;
constexpr uint64_t kDirectMinBytes = uint64_t{64} << 10;
constexpr uint64_t kDirectBounceBytes = uint64_t{8} << 20;

// The whole blocks of the file range [at, end): [first, last), empty
// (last <= first) when it holds none. The writer and the reader send these
// with O_DIRECT and the partial blocks either side through the page cache.
std::pair<uint64_t, uint64_t> direct_blocks(uint64_t at, uint64_t end) {
  return {(at + kDirectBlock - 1) / kDirectBlock * kDirectBlock, end / kDirectBlock * kDirectBlock};
}

}  // namespace

uint64_t tensor_type_bytes(TensorType t) {
  switch (t) {
    case TensorType::kF32: return 4;
    case TensorType::kF16:
    case TensorType::kBF16: return 2;
    case TensorType::kU8: return 1;
  }
  return 0;
}

uint64_t TensorInfo::bytes() const {
  uint64_t n = tensor_type_bytes(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

struct SafetensorsWriter::Hashing {
  struct Tensor {
    XXH3_state_t* state = nullptr;
    uint64_t hashed = 0;    // bytes hashed, from the tensor's start
    bool in_order = true;   // every write began where the hashed bytes end
  };
  std::vector<Tensor> tensors;
  ~Hashing() {
    for (Tensor& t : tensors) XXH3_freeState(t.state);
  }
};

SafetensorsWriter::SafetensorsWriter() = default;
SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter::~SafetensorsWriter() = default;

Result<SafetensorsWriter> SafetensorsWriter::create(const std::string& path, std::vector<TensorInfo> tensors,
                                                    const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> meta = metadata;
  std::set<std::string> names;
  std::vector<uint64_t> begin;
  uint64_t offset = 0;
  for (const TensorInfo& t : tensors) {
    if (!names.insert(t.name).second || t.name == "__metadata__") {
      return invalid_argument("safetensors " + path + ": tensor name " + t.name + " twice or reserved");
    }
    begin.push_back(offset);
    offset += t.bytes();
    meta[std::string(kChecksumKeyPrefix) + t.name] = hex64(0);  // filled in by finish()
  }
  for (const auto& [key, value] : metadata) {
    if (key.rfind(kChecksumKeyPrefix, 0) == 0) {
      return invalid_argument("safetensors " + path + ": metadata key " + key + " is strata's own");
    }
  }
  const std::string text = header_text(tensors, meta);
  // Read and write: finish() reads back a tensor written out of order to hash it.
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, "create " + path);
  SafetensorsWriter w;
  w.fd_ = UniqueFd(fd);
  w.path_ = path;
  w.tensors_ = std::move(tensors);
  w.begin_ = std::move(begin);
  w.written_.assign(w.tensors_.size(), 0);
  w.data_start_ = 8 + text.size();
  w.metadata_ = std::move(meta);
  w.hashing_ = std::make_unique<Hashing>();
  w.hashing_->tensors.resize(w.tensors_.size());
  for (Hashing::Tensor& t : w.hashing_->tensors) {
    t.state = XXH3_createState();
    if (t.state == nullptr) return resource_exhausted("safetensors " + path + ": no memory for the checksums");
    XXH3_64bits_reset(t.state);
  }
  const std::array<unsigned char, 8> le = little_endian(text.size());
  STRATA_RETURN_IF_ERROR(write_all(fd, le.data(), 8, path));
  STRATA_RETURN_IF_ERROR(write_all(fd, text.data(), text.size(), path));
  const int direct = ::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  if (direct >= 0) {
    w.direct_fd_ = UniqueFd(direct);
    Result<io::Buffer> bounce = io::allocate_aligned(kDirectBounceBytes, kDirectBlock);
    if (bounce) {
      w.bounce_ = std::move(bounce).value();
    } else {
      w.direct_fd_ = UniqueFd();  // the page cache, then
    }
  }
  return w;
}

Status SafetensorsWriter::append(std::span<const std::byte> data) {
  while (!data.empty()) {
    while (current_ < tensors_.size() && written_[current_] == tensors_[current_].bytes()) ++current_;
    if (current_ >= tensors_.size()) {
      return invalid_argument("safetensors " + path_ + ": more data than the declared tensors hold");
    }
    const uint64_t n = std::min<uint64_t>(tensors_[current_].bytes() - written_[current_], data.size());
    STRATA_RETURN_IF_ERROR(write_at(current_, written_[current_], data.first(static_cast<size_t>(n))));
    data = data.subspan(static_cast<size_t>(n));
  }
  return ok_status();
}

Status SafetensorsWriter::write_at(size_t index, uint64_t offset, std::span<const std::byte> data) {
  if (index >= tensors_.size() || offset > tensors_[index].bytes() ||
      data.size() > tensors_[index].bytes() - offset) {
    return invalid_argument("safetensors " + path_ + ": " + std::to_string(data.size()) + " bytes at " +
                            std::to_string(offset) + " do not fit tensor " +
                            (index < tensors_.size() ? tensors_[index].name : std::to_string(index)));
  }
  STRATA_RETURN_IF_ERROR(write_bytes(data_start_ + begin_[index] + offset, data));
  written_[index] += data.size();
  Hashing::Tensor& h = hashing_->tensors[index];
  if (h.in_order && offset == h.hashed) {
    XXH3_64bits_update(h.state, data.data(), data.size());
    h.hashed += data.size();
  } else {
    h.in_order = false;  // finish() reads it back
  }
  return ok_status();
}

Status SafetensorsWriter::hash_back(size_t index) {
  Hashing::Tensor& h = hashing_->tensors[index];
  XXH3_64bits_reset(h.state);
  std::vector<std::byte> piece(static_cast<size_t>(std::min(kVerifyPieceBytes, tensors_[index].bytes())));
  for (uint64_t done = 0; done < tensors_[index].bytes();) {
    const uint64_t n = std::min<uint64_t>(piece.size(), tensors_[index].bytes() - done);
    const uint64_t at = data_start_ + begin_[index] + done;
    const ssize_t got = ::pread(fd_.get(), piece.data(), n, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno_status(errno, "read back " + path_ + " for its checksums");
    if (got == 0) return data_loss("safetensors " + path_ + ": reading back " + tensors_[index].name + ": file ends");
    XXH3_64bits_update(h.state, piece.data(), static_cast<size_t>(got));
    done += static_cast<uint64_t>(got);
  }
  return ok_status();
}

Status SafetensorsWriter::write_bytes(uint64_t at, std::span<const std::byte> data) {
  const uint64_t end = at + data.size();
  const auto [first, last] = direct_blocks(at, end);
  if (!direct_fd_.valid() || last < first + kDirectMinBytes) {
    return pwrite_all(fd_.get(), data.data(), data.size(), at, path_);
  }
  // The partial blocks at either end through the page cache; no other
  // write touches the whole blocks between them.
  STRATA_RETURN_IF_ERROR(pwrite_all(fd_.get(), data.data(), first - at, at, path_));
  STRATA_RETURN_IF_ERROR(pwrite_all(fd_.get(), data.data() + (last - at), end - last, last, path_));
  for (uint64_t pos = first; pos < last;) {
    const uint64_t n = std::min<uint64_t>(bounce_.capacity_bytes(), last - pos);
    std::memcpy(bounce_.data(), data.data() + (pos - at), n);
    const ssize_t put = ::pwrite(direct_fd_.get(), bounce_.data(), n, static_cast<off_t>(pos));
    if (put < 0 && errno == EINTR) continue;
    if (put < 0 && errno == EINVAL) {
      // An alignment this filesystem does not take after all: the rest
      // through the page cache.
      direct_fd_ = UniqueFd();
      return pwrite_all(fd_.get(), data.data() + (pos - at), last - pos, pos, path_);
    }
    if (put < 0) return errno_status(errno, "write " + path_);
    if (static_cast<uint64_t>(put) != n) {
      // A short direct write (a full disk on the way): the rest, whatever
      // its alignment, through the page cache, which reports the error.
      direct_bytes_ += static_cast<uint64_t>(put);
      pos += static_cast<uint64_t>(put);
      return pwrite_all(fd_.get(), data.data() + (pos - at), last - pos, pos, path_);
    }
    direct_bytes_ += n;
    pos += n;
  }
  return ok_status();
}

Status SafetensorsWriter::finish() {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (written_[i] != tensors_[i].bytes()) {
      return failed_precondition("safetensors " + path_ + ": tensor " + tensors_[i].name + " was not written in full");
    }
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!hashing_->tensors[i].in_order) STRATA_RETURN_IF_ERROR(hash_back(i));
    metadata_[std::string(kChecksumKeyPrefix) + tensors_[i].name] = hex64(XXH3_64bits_digest(hashing_->tensors[i].state));
  }
  // The same keys and value widths as the placeholders: the same length.
  const std::string text = header_text(tensors_, metadata_);
  STRATA_CHECK_MSG(8 + text.size() == data_start_, "safetensors header changed length: %zu", text.size());
  STRATA_RETURN_IF_ERROR(pwrite_all(fd_.get(), text.data(), text.size(), 8, path_));
  header_digest_ = header_digest_of(text);
  file_bytes_ = data_start_ + (tensors_.empty() ? 0 : begin_.back() + tensors_.back().bytes());
  if (::fsync(fd_.get()) != 0) return errno_status(errno, "fsync " + path_);
  return fd_.close();
}

namespace {

// One header entry into `t` and its data offsets; false when malformed.
bool parse_entry(const nlohmann::json& v, TensorInfo* t, uint64_t* begin, uint64_t* end) {
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) return false;
  const std::optional<TensorType> dtype = dtype_from(v.at("dtype"));
  if (!dtype) return false;
  t->dtype = *dtype;
  const nlohmann::json& shape = v.at("shape");
  const nlohmann::json& off = v.at("data_offsets");
  if (!shape.is_array() || !off.is_array() || off.size() != 2) return false;
  // The product in 128 bits: a shape whose bytes overflow is corrupt.
  unsigned __int128 bytes = tensor_type_bytes(t->dtype);
  for (const nlohmann::json& d : shape) {
    if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) return false;
    const auto dim = d.get<uint64_t>();
    if (dim > (uint64_t{1} << 62)) return false;
    bytes *= dim;
    if (bytes > (static_cast<unsigned __int128>(1) << 62)) return false;
    t->shape.push_back(static_cast<int64_t>(dim));
  }
  for (const nlohmann::json& o : off) {
    if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0)) return false;
  }
  *begin = off[0].get<uint64_t>();
  *end = off[1].get<uint64_t>();
  return *end >= *begin && *end - *begin == static_cast<uint64_t>(bytes);
}

}  // namespace

Result<SafetensorsReader> SafetensorsReader::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "open " + path);
  SafetensorsReader r;
  r.fd_ = UniqueFd(fd);
  r.path_ = path;
  r.direct_fd_ = UniqueFd(::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));  // invalid where refused
  unsigned char le[8];
  if (::pread(fd, le, 8, 0) != 8) return data_loss("safetensors " + path + ": file shorter than its 8-byte header");
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= static_cast<uint64_t>(le[i]) << (8 * i);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_status(errno, "stat " + path);
  r.file_bytes_ = static_cast<uint64_t>(st.st_size);
  if (length > r.file_bytes_ - 8 || length > (100u << 20)) {
    return data_loss("safetensors " + path + ": header length " + std::to_string(length) + " is corrupt");
  }
  std::string text(length, '\0');
  if (::pread(fd, text.data(), length, 8) != static_cast<ssize_t>(length)) {
    return data_loss("safetensors " + path + ": short header");
  }
  r.header_digest_ = header_digest_of(text);
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return data_loss("safetensors " + path + ": header is not JSON");
  r.data_start_ = 8 + length;
  const uint64_t data_bytes = r.file_bytes_ - r.data_start_;
  std::map<std::string, uint64_t> sums;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return data_loss("safetensors " + path + ": __metadata__ is not an object");
      for (const auto& [k, val] : v.items()) {
        if (!val.is_string()) return data_loss("safetensors " + path + ": metadata " + k + " is not a string");
        if (k.rfind(kChecksumKeyPrefix, 0) != 0) {
          r.metadata_[k] = val.get<std::string>();
        } else if (!parse_hex64(val.get<std::string>(), &sums[k.substr(kChecksumKeyPrefix.size())])) {
          return data_loss("safetensors " + path + ": checksum " + k + " is not 16 hex digits");
        }
      }
      continue;
    }
    TensorInfo t;
    t.name = name;
    uint64_t begin = 0, end = 0;
    if (!parse_entry(v, &t, &begin, &end)) {
      return data_loss("safetensors " + path + ": tensor " + name + ": entry " + v.dump() +
                       " is not a dtype (F32, BF16, F16, U8), shape and data_offsets that agree");
    }
    if (end > data_bytes) return data_loss("safetensors " + path + ": tensor " + name + " is truncated");
    r.index_[t.name] = r.tensors_.size();
    r.begin_.push_back(begin);
    r.tensors_.push_back(std::move(t));
  }
  STRATA_RETURN_IF_ERROR(r.check_layout(data_bytes, std::move(sums)));
  return r;
}

Status SafetensorsReader::check_layout(uint64_t data_bytes, std::map<std::string, uint64_t> sums) {
  // As the format has them: the tensors' bytes back to back from the data's
  // start, without gaps or overlaps, ending where the file ends.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return begin_[a] < begin_[b]; });
  uint64_t next = 0;
  for (size_t i : order) {
    if (begin_[i] != next) {
      return data_loss("safetensors " + path_ + ": tensor " + tensors_[i].name + " starts at data byte " +
                       std::to_string(begin_[i]) + ", not " + std::to_string(next) + " (a gap or an overlap)");
    }
    next += tensors_[i].bytes();
  }
  if (next != data_bytes) {
    return data_loss("safetensors " + path_ + ": " + std::to_string(data_bytes - next) +
                     " bytes after the last tensor's (the file is damaged or was appended to)");
  }
  if (!sums.empty()) {
    // Checksums for every tensor or for none: a file strata wrote has them all.
    for (const TensorInfo& t : tensors_) {
      const auto it = sums.find(t.name);
      if (it == sums.end()) return data_loss("safetensors " + path_ + ": tensor " + t.name + " has no checksum");
      checksums_.push_back(it->second);
      sums.erase(it);
    }
    if (!sums.empty()) {
      return data_loss("safetensors " + path_ + ": a checksum for " + sums.begin()->first + ", which is not a tensor");
    }
  }
  return ok_status();
}

const TensorInfo* SafetensorsReader::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsReader::verify(const Visitor& visit) const {
  std::vector<std::byte> piece;
  XXH3_state_t* st = XXH3_createState();
  if (st == nullptr) return resource_exhausted("safetensors " + path_ + ": no memory to verify it");
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> owner(st, XXH3_freeState);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    XXH3_64bits_reset(st);
    for (uint64_t done = 0; done < t.bytes();) {
      const uint64_t n = std::min(kVerifyPieceBytes, t.bytes() - done);
      piece.resize(static_cast<size_t>(n));
      STRATA_RETURN_IF_ERROR(read_bytes(data_start_ + begin_[i] + done, piece, t.name));
      XXH3_64bits_update(st, piece.data(), piece.size());
      if (visit) STRATA_RETURN_IF_ERROR(visit(t, done, piece));
      done += n;
    }
    if (!checksums_.empty() && XXH3_64bits_digest(st) != checksums_[i]) {
      const uint64_t at = data_start_ + begin_[i];
      return data_loss("safetensors " + path_ + ": tensor " + t.name + " (file bytes " + std::to_string(at) + ".." +
                       std::to_string(at + t.bytes()) +
                       ") does not match its checksum: the file is damaged; nothing of it was used");
    }
  }
  return ok_status();
}

Status SafetensorsReader::read(const std::string& name, std::span<std::byte> out, uint64_t offset) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return not_found("safetensors " + path_ + ": no tensor " + name);
  const size_t i = it->second;
  if (offset + out.size() > tensors_[i].bytes()) {
    return invalid_argument("safetensors " + path_ + ": reading past the end of " + name);
  }
  return read_bytes(data_start_ + begin_[i] + offset, out, name);
}

Status SafetensorsReader::read_bytes(uint64_t at, std::span<std::byte> out, const std::string& name) const {
  auto buffered = [&](uint64_t pos, std::byte* p, uint64_t left) -> Status {
    while (left > 0) {
      const ssize_t n = ::pread(fd_.get(), p, left, static_cast<off_t>(pos));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno_status(errno, "read " + path_);
      if (n == 0) return data_loss("safetensors " + path_ + ": " + name + " is truncated");
      p += n;
      pos += static_cast<uint64_t>(n);
      left -= static_cast<uint64_t>(n);
    }
    return ok_status();
  };
  const uint64_t end = at + out.size();
  const auto [first, last] = direct_blocks(at, end);
  if (!direct_fd_.valid() || last < first + kDirectMinBytes) return buffered(at, out.data(), out.size());
  if (bounce_.data() == nullptr) {
    Result<io::Buffer> b = io::allocate_aligned(kDirectBounceBytes, kDirectBlock);
    if (!b) return buffered(at, out.data(), out.size());
    bounce_ = std::move(b).value();
  }
  STRATA_RETURN_IF_ERROR(buffered(at, out.data(), first - at));
  STRATA_RETURN_IF_ERROR(buffered(last, out.data() + (last - at), end - last));
  for (uint64_t pos = first; pos < last;) {
    const uint64_t n = std::min<uint64_t>(bounce_.capacity_bytes(), last - pos);
    const ssize_t got = ::pread(direct_fd_.get(), bounce_.data(), n, static_cast<off_t>(pos));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == EINVAL) {
      direct_fd_ = UniqueFd();  // an alignment this filesystem does not take: the page cache
      return buffered(pos, out.data() + (pos - at), last - pos);
    }
    if (got < 0) return errno_status(errno, "read " + path_);
    if (got == 0) return data_loss("safetensors " + path_ + ": " + name + " is truncated");
    std::memcpy(out.data() + (pos - at), bounce_.data(), static_cast<size_t>(got));
    direct_bytes_ += static_cast<uint64_t>(got);
    pos += static_cast<uint64_t>(got);
    if (static_cast<uint64_t>(got) != n) {
      // A short direct read: the rest, whatever its alignment, through the
      // page cache (which reports a file cut short).
      return buffered(pos, out.data() + (pos - at), last - pos);
    }
  }
  return ok_status();
}

Status CheckpointDir::check_writable() const {
  std::error_code ec;
  std::filesystem::create_directories(root_, ec);
  if (ec) return errno_status(ec.value(), "checkpoint: creating the root " + root_);
  return check_directory_writable(root_).with_context("checkpoint");
}

Status CheckpointDir::lock() {
  if (lock_.valid()) return ok_status();
  std::error_code ec;
  std::filesystem::create_directories(root_, ec);
  if (ec) return errno_status(ec.value(), "checkpoint: creating the root " + root_);
  const std::string path = root_ + "/.lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) return errno_status(errno, "checkpoint: opening the writer lock " + path);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    // A filesystem without locks (some network and FUSE ones) keeps the
    // protocol as it was before the lock: one writer by convention.
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) return ok_status();
    if (err != EWOULDBLOCK) return errno_status(err, "checkpoint: locking " + path);
    char text[32] = {};
    const ssize_t n = ::pread(fd.get(), text, sizeof(text) - 1, 0);
    std::string holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    if (holder.empty()) holder = "unknown";
    if (holder == std::to_string(::getpid())) holder += ", this process";
    return failed_precondition("checkpoint: " + root_ + " is being written by another writer (pid " + holder +
                               ", which holds " + path + "); one writer per checkpoint directory");
  }
  // The holder's pid, for the message a second writer gets.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0) return errno_status(errno, "checkpoint: truncating " + path);
  STRATA_RETURN_IF_ERROR(pwrite_all(fd.get(), pid.data(), pid.size(), 0, path));
  lock_ = std::move(fd);
  return ok_status();
}

Result<std::string> CheckpointDir::begin(int64_t step) {
  STRATA_RETURN_IF_ERROR(lock());
  std::error_code ec;
  std::string name = "step-" + std::to_string(step);
  for (int k = 1; std::filesystem::exists(root_ + "/" + name); ++k) {
    name = "step-" + std::to_string(step) + ".r" + std::to_string(k);
  }
  // Earlier attempts a killed writer left (step-*.tmp; latest.tmp is the
  // pointer's own and is replaced by commit()).
  std::vector<std::filesystem::path> unfinished;
  for (const auto& entry : std::filesystem::directory_iterator(root_, ec)) {
    const std::string leaf = entry.path().filename().string();
    if (leaf.rfind("step-", 0) == 0 && leaf.ends_with(".tmp")) unfinished.push_back(entry.path());
  }
  if (ec) return errno_status(ec.value(), "checkpoint: listing " + root_);
  for (const auto& path : unfinished) {
    std::filesystem::remove_all(path, ec);
    if (ec) return errno_status(ec.value(), "checkpoint: removing the unfinished " + path.string());
  }
  pending_ = name;
  std::string tmp = root_ + "/" + name + ".tmp";
  if (!std::filesystem::create_directory(tmp, ec) || ec) {
    return ec ? errno_status(ec.value(), "checkpoint: creating " + tmp)
              : failed_precondition("checkpoint: cannot create " + tmp + ": it exists");
  }
  return tmp;
}

Status CheckpointDir::commit(int64_t step) {
  const std::string expect = "step-" + std::to_string(step);
  STRATA_CHECK_MSG(pending_.rfind(expect, 0) == 0, "checkpoint commit of step %lld without its begin()",
                   static_cast<long long>(step));
  const std::string final_path = root_ + "/" + pending_, tmp = final_path + ".tmp";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(tmp, ec)) {
    if (entry.is_regular_file()) STRATA_RETURN_IF_ERROR(fsync_path(entry.path().string(), false));
  }
  if (ec) return errno_status(ec.value(), "checkpoint: listing " + tmp);
  STRATA_RETURN_IF_ERROR(fsync_path(tmp, true));
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) return errno_status(errno, "rename " + tmp + " to " + final_path);
  STRATA_RETURN_IF_ERROR(fsync_path(root_, true));
  // Point `latest` at it: write, fsync, rename over the old pointer.
  const std::string latest_tmp = root_ + "/latest.tmp", latest_file = root_ + "/latest";
  int fd = ::open(latest_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, "create " + latest_tmp);
  UniqueFd owner(fd);
  std::string line = pending_ + "\n";
  STRATA_RETURN_IF_ERROR(write_all(fd, line.data(), line.size(), latest_tmp));
  if (::fsync(fd) != 0) return errno_status(errno, "fsync " + latest_tmp);
  STRATA_RETURN_IF_ERROR(owner.close());
  if (::rename(latest_tmp.c_str(), latest_file.c_str()) != 0) return errno_status(errno, "rename " + latest_tmp);
  pending_.clear();
  return fsync_path(root_, true);
}

void CheckpointDir::abandon() {
  if (pending_.empty()) return;
  const std::string tmp = root_ + "/" + pending_ + ".tmp";
  pending_.clear();
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);  // best effort: the next begin() retries it
}

Result<int> CheckpointDir::prune(int keep) {
  if (keep < 0) return invalid_argument("checkpoint: keep must be >= 0, got " + std::to_string(keep));
  if (keep == 0) return 0;
  STRATA_RETURN_IF_ERROR(lock());
  Result<Entry> newest = latest();
  if (!newest) return newest.error().code() == StatusCode::kNotFound ? Result<int>(0) : Result<int>(newest.error());
  // step-<N> and step-<N>.r<k>, complete (no .tmp), ordered by (N, k).
  struct Saved {
    int64_t step, resave;
    std::filesystem::path path;
  };
  std::vector<Saved> saved;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root_, ec)) {
    int64_t step = 0, resave = 0;
    if (!entry.is_directory() || !parse_checkpoint_name(entry.path().filename().string(), &step, &resave)) continue;
    saved.push_back({step, resave, entry.path()});
  }
  if (ec) return errno_status(ec.value(), "checkpoint: listing " + root_);
  std::sort(saved.begin(), saved.end(),
            [](const Saved& a, const Saved& b) { return std::tie(a.step, a.resave) > std::tie(b.step, b.resave); });
  int removed = 0;
  for (size_t i = static_cast<size_t>(keep); i < saved.size(); ++i) {
    if (saved[i].path.filename() == std::filesystem::path(newest->path).filename()) continue;  // `latest`'s
    std::filesystem::remove_all(saved[i].path, ec);
    if (ec) return errno_status(ec.value(), "checkpoint: removing " + saved[i].path.string());
    ++removed;
  }
  return removed;
}

Result<CheckpointDir::Entry> CheckpointDir::latest() const {
  const std::string latest_file = root_ + "/latest";
  int fd = ::open(latest_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found("no checkpoint in " + root_ + " (no 'latest' pointer)");
    return errno_status(errno, "open " + latest_file);
  }
  UniqueFd owner(fd);
  char buf[128] = {};
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  if (n <= 0) return data_loss(latest_file + " is empty");
  std::string name(buf, static_cast<size_t>(n));
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  int64_t step = 0, resave = 0;
  if (!parse_checkpoint_name(name, &step, &resave)) {
    return data_loss(latest_file + " does not name a checkpoint: " + name);
  }
  Entry e{step, root_ + "/" + name};
  struct stat st {};
  if (::stat(e.path.c_str(), &st) != 0) return data_loss(latest_file + " names " + e.path + ", which is missing");
  return e;
}

Result<int64_t> CheckpointDir::latest_step() const {
  STRATA_ASSIGN_OR_RETURN(Entry e, latest());
  return e.step;
}

Status check_finite(const std::string& path, const TensorInfo& t, uint64_t offset, std::span<const std::byte> bytes) {
  // Exponent bits all ones: inf or NaN, in each format's layout.
  auto first_bad = [&]() -> int64_t {
    switch (t.dtype) {
      case TensorType::kF32:
        for (size_t k = 0; k + 4 <= bytes.size(); k += 4) {
          uint32_t x;
          std::memcpy(&x, bytes.data() + k, 4);
          if ((x & 0x7F800000u) == 0x7F800000u) return static_cast<int64_t>(k / 4);
        }
        return -1;
      case TensorType::kBF16:
      case TensorType::kF16: {
        const uint16_t mask = t.dtype == TensorType::kBF16 ? 0x7F80 : 0x7C00;
        for (size_t k = 0; k + 2 <= bytes.size(); k += 2) {
          uint16_t x;
          std::memcpy(&x, bytes.data() + k, 2);
          if ((x & mask) == mask) return static_cast<int64_t>(k / 2);
        }
        return -1;
      }
      case TensorType::kU8: return -1;
    }
    return -1;
  };
  const int64_t bad = first_bad();
  if (bad < 0) return ok_status();
  const int64_t element = static_cast<int64_t>(offset / tensor_type_bytes(t.dtype)) + bad;
  return data_loss("safetensors " + path + ": tensor " + t.name + " holds a NaN or infinity at element " +
                   std::to_string(element) + "; refusing to load it");
}

std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string seal_record(const nlohmann::json& record) {
  // Only an object has room for a seal; anything else is written as it is,
  // and open_record refuses it (a record is an object).
  if (!record.is_object()) return record.dump(2) + "\n";
  nlohmann::json sealed = record;
  sealed.erase("checksum");
  const std::string compact = sealed.dump();
  sealed["checksum"] = hex64(XXH3_64bits(compact.data(), compact.size()));
  return sealed.dump(2) + "\n";
}

Result<nlohmann::json> open_record(const std::string& path, const std::set<std::string>& legacy_keys, bool* legacy) {
  *legacy = false;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return data_loss(path + " is missing: the checkpoint is incomplete");
    return errno_status(errno, "open " + path);
  }
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(errno, "read " + path);
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > (16u << 20)) return data_loss(path + " is larger than any record strata writes");
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return data_loss(path + " is not valid JSON");
  if (!j.contains("checksum")) {
    for (const auto& [key, value] : j.items()) {
      if (legacy_keys.count(key) == 0) return data_loss(path + ": no checksum, and a key " + key + " none was written with");
    }
    *legacy = true;
    return j;
  }
  if (seal_record(j) != text) {
    return data_loss(path + " does not match its checksum (or is not as strata writes it): the file was edited or "
                            "is damaged");
  }
  j.erase("checksum");
  return j;
}

}  // namespace strata::engine
