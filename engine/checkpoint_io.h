// Checkpoint files: safetensors written tensor by tensor (so state that lives
// on NVMe streams straight from its tier and is never gathered whole in RAM)
// and read back by name; and a checkpoint directory protocol that never
// leaves a half-written checkpoint looking valid:
//   <root>/step-<N>.tmp/   written, every file fsynced, the directory fsynced,
//   <root>/step-<N>/       then renamed into place (and the root fsynced;
//                          a step saved again gets step-<N>.r<k>),
//   <root>/latest          then a one-line pointer, replaced atomically
//                          (written to latest.tmp, fsynced, renamed).
// A process killed at any point leaves `latest` naming a complete checkpoint.
//   <root>/.lock           the writer's lock (flock), one writer at a time.
//
// What outlives the process is verified before it is used: every tensor of a
// safetensors file strata writes carries an xxh3-64 of its bytes in the
// header's metadata (computed as the data streams out), and the reader's
// verify() streams each tensor back against it; a record (trainer.json) is
// sealed by a checksum of its canonical text (seal_record / open_record) and
// names each data file's size and header digest, so one flipped byte
// anywhere — data, header or record — is refused as DataLoss by name.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "io/buffer.h"

namespace strata::engine {

// A safetensors element type: strata's floating types, and U8 for raw
// bytes (8-bit optimizer-state codes).
enum class TensorType : uint8_t { kF32, kF16, kBF16, kU8 };
constexpr TensorType tensor_type(DType t) {
  return t == DType::kF32 ? TensorType::kF32 : (t == DType::kF16 ? TensorType::kF16 : TensorType::kBF16);
}
uint64_t tensor_type_bytes(TensorType t);

struct TensorInfo {
  std::string name;
  TensorType dtype = TensorType::kF32;
  std::vector<int64_t> shape;
  uint64_t bytes() const;
};

// Writes one .safetensors file: the header (all names, dtypes, shapes and
// offsets) first, then each tensor's bytes — in the declared order,
// appended in as many pieces as the caller likes, or placed at an offset
// in a tensor (write_at), each byte once. The whole 4 KiB blocks of a
// big write go to the disk with O_DIRECT (through an aligned bounce
// buffer), the rest through the page cache: a checkpoint of model states
// is not copied into the page cache nor throttled behind its writeback.
// Where the filesystem refuses O_DIRECT (tmpfs), everything goes through
// the page cache. Each block is written by one of the two paths only.
// Each tensor's xxh3-64 goes into the metadata as
// "strata.xxh3.<name>": 16 hex digits, written as zeros with the header and
// filled in by finish() (the header keeps its length). A tensor written in
// order (each write where the last ended) is hashed as it goes; one written
// out of order is read back once by finish().
inline constexpr std::string_view kChecksumKeyPrefix = "strata.xxh3.";

class SafetensorsWriter {
 public:
  static Result<SafetensorsWriter> create(const std::string& path, std::vector<TensorInfo> tensors,
                                          const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept;
  ~SafetensorsWriter();

  // Appends bytes of the current tensor (moving on to the next when it is full).
  Status append(std::span<const std::byte> data);
  // Writes bytes of tensor `index` from byte `offset` of it.
  Status write_at(size_t index, uint64_t offset, std::span<const std::byte> data);
  // Checks every tensor was written in full, writes their checksums into
  // the header, fsyncs and closes.
  Status finish();
  // Bytes written with O_DIRECT so far.
  uint64_t direct_bytes() const { return direct_bytes_; }
  // After finish(): the xxh3-64 of the file's header (its 8-byte length and
  // JSON, checksums included) and the file's size, for a record to bind.
  uint64_t header_digest() const { return header_digest_; }
  uint64_t file_bytes() const { return file_bytes_; }

 private:
  struct Hashing;  // one xxh3 stream per tensor
  SafetensorsWriter();
  Status write_bytes(uint64_t at, std::span<const std::byte> data);
  Status hash_back(size_t index);  // a tensor written out of order, read back
  std::unique_ptr<Hashing> hashing_;
  std::map<std::string, std::string> metadata_;
  uint64_t header_digest_ = 0;
  uint64_t file_bytes_ = 0;
  std::string path_;
  UniqueFd fd_;
  UniqueFd direct_fd_;  // the same file with O_DIRECT; invalid where refused
  io::Buffer bounce_;   // 4 KiB-aligned staging for direct writes
  uint64_t direct_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  uint64_t data_start_ = 0;          // file offset of the first tensor's bytes
  std::vector<uint64_t> begin_;      // each tensor's bytes, from data_start_
  std::vector<uint64_t> written_;    // bytes written of each tensor
  size_t current_ = 0;               // the tensor append() writes
};

class SafetensorsReader {
 public:
  // Reads and checks the header: every entry well-formed (a supported
  // dtype, non-negative dimensions, offsets inside the file that match the
  // shape), and checksums for every tensor or for none. DataLoss naming
  // the file (and the tensor) otherwise.
  static Result<SafetensorsReader> open(const std::string& path);
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The metadata but the checksums.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor called `name`, or null.
  const TensorInfo* find(const std::string& name) const;
  // Whether the file carries a checksum per tensor (written by strata).
  bool has_checksums() const { return !checksums_.empty(); }
  // The xxh3-64 of the header as read, and the file's size.
  uint64_t header_digest() const { return header_digest_; }
  uint64_t file_bytes() const { return file_bytes_; }
  // Streams every tensor's bytes once, in pieces, to `visit` (tensor,
  // byte offset in it, bytes) and against its checksum: DataLoss naming
  // the file, the tensor and its byte range in the file on a mismatch; the
  // first error of `visit` is returned as it is.
  using Visitor = std::function<Status(const TensorInfo&, uint64_t, std::span<const std::byte>)>;
  Status verify(const Visitor& visit) const;
  // Reads `name`'s bytes (or a part of them from `offset`) into `out`: as
  // the writer writes, the whole 4 KiB blocks of a big read with O_DIRECT
  // (through a bounce buffer: one reader is one thread's), the rest
  // through the page cache.
  Status read(const std::string& name, std::span<std::byte> out, uint64_t offset = 0) const;
  // Bytes read with O_DIRECT so far.
  uint64_t direct_bytes() const { return direct_bytes_; }

 private:
  Status read_bytes(uint64_t at, std::span<std::byte> out, const std::string& name) const;
  // open()'s checks of the tensors' places (back to back, to the file's
  // end) and of `sums` (tensor -> checksum: for all of them or none).
  Status check_layout(uint64_t data_bytes, std::map<std::string, uint64_t> sums);
  std::string path_;
  UniqueFd fd_;
  mutable UniqueFd direct_fd_;  // the same file with O_DIRECT; invalid where refused
  mutable io::Buffer bounce_;   // allocated on the first direct read
  mutable uint64_t direct_bytes_ = 0;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::vector<uint64_t> begin_;
  std::vector<uint64_t> checksums_;  // per tensor; empty when the file has none
  std::unordered_map<std::string, size_t> index_;  // tensor name -> its position in tensors_
  std::map<std::string, std::string> metadata_;
  uint64_t header_digest_ = 0;
  uint64_t file_bytes_ = 0;
};

// DataLoss naming `path` and the tensor when any element of this piece of
// a floating-point tensor (F32, BF16, F16; `offset` bytes into it) is NaN
// or infinite; OK for U8.
Status check_finite(const std::string& path, const TensorInfo& tensor, uint64_t offset,
                    std::span<const std::byte> bytes);

// A record file's text: `record` with a "checksum" key added (the xxh3-64
// of the record's compact JSON, 16 hex digits), pretty-printed. JSON
// objects print their keys sorted, so the text is canonical. A record that
// is not an object is printed unsealed (open_record refuses it).
std::string seal_record(const nlohmann::json& record);
// Reads a record sealed by seal_record: the record without its checksum.
// DataLoss naming the file when it is missing (the checkpoint is
// incomplete), is not JSON, or is not exactly the sealed text of what it
// holds (a byte edited anywhere). A record with no checksum whose keys are
// all among `legacy_keys` (written before records were sealed) is returned
// with *legacy set; any other key beside them is DataLoss.
Result<nlohmann::json> open_record(const std::string& path, const std::set<std::string>& legacy_keys, bool* legacy);
// 16 lowercase hex digits.
std::string hex64(uint64_t value);

// The directory protocol above. A checkpoint of a step that already has one
// goes to a fresh name (step-<N>.r<k>), so the directory `latest` names is
// never removed or overwritten before `latest` moves on. A root has one
// writer, which holds its lock (lock()): begin() removes every .tmp
// directory a killed writer left, and an attempt that does not commit (a
// full disk, a failed read of a state) is removed when the CheckpointDir
// goes — a failed checkpoint must not keep the space the next one needs.
// Reading (latest(), a resume) takes no lock.
class CheckpointDir {
 public:
  struct Entry {
    int64_t step = 0;
    std::string path;  // the directory
  };

  explicit CheckpointDir(std::string root) : root_(std::move(root)) {}
  ~CheckpointDir() { abandon(); }
  CheckpointDir(const CheckpointDir&) = delete;
  CheckpointDir& operator=(const CheckpointDir&) = delete;
  // Creates the root if needed and checks that files can be made in it:
  // for a caller that will save after long work.
  Status check_writable() const;
  // The root's writer lock: an exclusive flock(2) on <root>/.lock (made
  // with the root if needed), held until this CheckpointDir goes; the
  // kernel drops it when the process ends, however it ends. begin() and
  // prune() take it when this object does not hold it yet. A caller that
  // writes a root for a whole run takes it first, so that a second writer
  // is refused at once — FailedPrecondition naming the holder's pid —
  // rather than removing the first's unfinished checkpoint or
  // interleaving its own. Another CheckpointDir of the same process is
  // another writer too. On a filesystem that has no locks (flock fails
  // with ENOLCK / EOPNOTSUPP) it is OK without a lock.
  Status lock();
  // Creates (empty) <root>/<name>.tmp for the step and returns its path,
  // after removing the .tmp directories of earlier attempts.
  Result<std::string> begin(int64_t step);
  // fsyncs the files in the .tmp directory and the directory, renames it into
  // place, and points `latest` at it. `step` must match begin().
  Status commit(int64_t step);
  // Removes the .tmp directory of a begin() that was not committed (nothing
  // when there is none).
  void abandon();
  // The checkpoint `latest` names; NotFound when there is none.
  Result<Entry> latest() const;
  // Removes the complete checkpoints but the `keep` newest (by step, then
  // by resave number) and the one `latest` names; keep 0 removes nothing.
  // Returns how many it removed.
  Result<int> prune(int keep);
  Result<int64_t> latest_step() const;

 private:
  std::string root_;
  std::string pending_;  // the final name chosen by begin()
  UniqueFd lock_;        // <root>/.lock, flocked: lock()
};

}  // namespace strata::engine
