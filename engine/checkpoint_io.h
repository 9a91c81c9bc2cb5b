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
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
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
class SafetensorsWriter {
 public:
  static Result<SafetensorsWriter> create(const std::string& path, std::vector<TensorInfo> tensors,
                                          const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept = default;

  // Appends bytes of the current tensor (moving on to the next when it is full).
  Status append(std::span<const std::byte> data);
  // Writes bytes of tensor `index` from byte `offset` of it.
  Status write_at(size_t index, uint64_t offset, std::span<const std::byte> data);
  // Checks every tensor was written in full, fsyncs and closes.
  Status finish();
  // Bytes written with O_DIRECT so far.
  uint64_t direct_bytes() const { return direct_bytes_; }

 private:
  SafetensorsWriter() = default;
  Status write_bytes(uint64_t at, std::span<const std::byte> data);
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
  static Result<SafetensorsReader> open(const std::string& path);
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Reads `name`'s bytes (or a part of them from `offset`) into `out`: as
  // the writer writes, the whole 4 KiB blocks of a big read with O_DIRECT
  // (through a bounce buffer: one reader is one thread's), the rest
  // through the page cache.
  Status read(const std::string& name, std::span<std::byte> out, uint64_t offset = 0) const;
  // Bytes read with O_DIRECT so far.
  uint64_t direct_bytes() const { return direct_bytes_; }

 private:
  Status read_bytes(uint64_t at, std::span<std::byte> out, const std::string& name) const;
  std::string path_;
  UniqueFd fd_;
  mutable UniqueFd direct_fd_;  // the same file with O_DIRECT; invalid where refused
  mutable io::Buffer bounce_;   // allocated on the first direct read
  mutable uint64_t direct_bytes_ = 0;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::vector<uint64_t> begin_;
  std::map<std::string, std::string> metadata_;
};

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
