// strata.aio's native half: an asynchronous tensor store over strata's I/O
// layer (io_uring, or the POSIX pool where io_uring is refused; O_DIRECT
// where the request and the filesystem allow it), and page-aligned, locked
// host buffers. strata/aio.py is the Python face.
//
// A request is cut into block_size pieces and queued; wait() reaps them
// all and reports each request's outcome. Under direct="require" a request
// whose address, offset or length is not a multiple of the file's direct
// I/O alignment (4 KiB, or what statx reports) is refused, and a file on a
// filesystem without O_DIRECT (tmpfs) too; under "prefer" (the default)
// such requests go through the page cache instead; under "off" all do.
#include "bindings/python/aio.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "io/buffer.h"
#include "io/device_factory.h"
#include "io/file.h"
#include "io/io_queue.h"

namespace py = pybind11;

namespace strata::python {
namespace {

// Raises the Python exception for a failed Status: FileNotFoundError,
// PermissionError, ValueError, or OSError, with the C++ message.
[[noreturn]] void raise_status(const Status& s, const std::string& path = "") {
  const std::string m = std::string(status_code_name(s.code())) + ": " + std::string(s.message());
  switch (s.code()) {
    case StatusCode::kNotFound:
      PyErr_SetObject(PyExc_FileNotFoundError, py::make_tuple(ENOENT, m, path).ptr());
      break;
    case StatusCode::kFailedPrecondition:
      PyErr_SetObject(PyExc_PermissionError, py::make_tuple(EACCES, m, path).ptr());
      break;
    case StatusCode::kInvalidArgument:
      throw py::value_error(m);
    case StatusCode::kResourceExhausted:
      PyErr_SetObject(PyExc_OSError, py::make_tuple(ENOSPC, m, path).ptr());
      break;
    default:
      PyErr_SetObject(PyExc_OSError, py::make_tuple(EIO, m, path).ptr());
      break;
  }
  throw py::error_already_set();
}

io::DirectMode direct_mode(const std::string& d) {
  if (d == "require") return io::DirectMode::kRequire;
  if (d == "prefer") return io::DirectMode::kPrefer;
  if (d == "off") return io::DirectMode::kOff;
  throw py::value_error("direct: expected \"require\", \"prefer\" or \"off\", got \"" + d + "\"");
}

}  // namespace

class AioHandle {
 public:
  AioHandle(uint64_t block_size, uint32_t queue_depth, int intra_op_parallelism, const std::string& direct,
            const std::string& backend)
      : block_size_(block_size), direct_(direct_mode(direct)) {
    if (block_size == 0 || block_size > io::kMaxRequestBytes || block_size % 4096 != 0) {
      throw py::value_error("block_size: expected a multiple of 4096 up to 1 GiB, got " + std::to_string(block_size));
    }
    if (queue_depth == 0 || queue_depth > 4096) {
      throw py::value_error("queue_depth: expected 1..4096, got " + std::to_string(queue_depth));
    }
    if (intra_op_parallelism < 1 || intra_op_parallelism > 256) {
      throw py::value_error("intra_op_parallelism: expected 1..256, got " + std::to_string(intra_op_parallelism));
    }
    Result<io::Backend> b = io::parse_backend(backend);
    if (!b) raise_status(b.error());
    io::DeviceOptions o;
    o.backend = *b;
    o.queue_depth = queue_depth;
    o.posix_threads = static_cast<uint32_t>(intra_op_parallelism);
    Result<std::unique_ptr<io::BlockDevice>> dev = io::make_block_device(o);
    if (!dev) raise_status(dev.error());
    device_ = std::move(*dev);
    queue_ = std::make_unique<io::IoQueue>(*device_);
  }

  ~AioHandle() {
    std::vector<io::IoResult> results;
    while (queue_ && queue_->outstanding() > 0) {
      if (!queue_->wait(queue_->outstanding(), results)) break;
    }
    for (auto& [key, f] : files_) (void)queue_->detach(f.slot);
  }

  std::string backend() const { return std::string(device_->name()); }

  // Queues one read or write of `bytes` bytes at `address`; returns its id.
  uint64_t submit(io::IoOp op, uintptr_t address, uint64_t bytes, const std::string& path, int64_t offset) {
    std::lock_guard lock(mu_);
    if (offset < 0) throw py::value_error("offset: expected >= 0, got " + std::to_string(offset));
    if (bytes == 0) {
      ++next_id_;
      done_ok_.push_back(next_id_);
      return next_id_;
    }
    const bool aligned_request = [&](uint64_t a) {
      return address % a == 0 && static_cast<uint64_t>(offset) % a == 0 && bytes % a == 0;
    }(4096);
    bool direct = direct_ != io::DirectMode::kOff && aligned_request;
    if (direct_ == io::DirectMode::kRequire && !aligned_request) {
      throw py::value_error(
          std::string(io::io_op_name(op)) + " " + path + ": address, offset (" + std::to_string(offset) +
          ") and length (" + std::to_string(bytes) +
          ") must be multiples of 4096 for O_DIRECT (direct=\"require\"); direct=\"prefer\" takes any");
    }
    OpenFile& f = open(path, op == io::IoOp::kWrite, direct);
    if (f.alignment > 1 && (address % f.alignment || offset % f.alignment || bytes % f.alignment)) {
      if (direct_ == io::DirectMode::kRequire) {
        throw py::value_error(path + ": the filesystem wants O_DIRECT requests aligned to " +
                              std::to_string(f.alignment) + " bytes");
      }
      direct = false;
    }
    OpenFile& target = direct ? f : open(path, op == io::IoOp::kWrite, /*direct=*/false);
    const uint64_t id = ++next_id_;
    Op& o = ops_[id];
    o.path = path;
    for (uint64_t done = 0; done < bytes; done += block_size_) {
      io::IoRequest r;
      r.op = op;
      r.file_slot = target.slot;
      r.offset_bytes = static_cast<uint64_t>(offset) + done;
      r.data = reinterpret_cast<std::byte*>(address + done);
      r.length_bytes = std::min(block_size_, bytes - done);
      r.tag = id;
      // A full queue: reap what has finished, then submit again.
      Status s = queue_->submit(r);
      while (!s.ok() && s.code() == StatusCode::kResourceExhausted) {
        if (!reap(1)) break;
        s = queue_->submit(r);
      }
      if (!s.ok()) {
        if (o.pieces > 0) {  // the pieces queued finish first; wait() raises this
          o.error = s;
          break;
        }
        ops_.erase(id);
        raise_status(s, path);
      }
      ++o.pieces;
    }
    return id;
  }

  // Waits for every queued request; returns how many finished. Raises the
  // first failure's error (after all of them have finished).
  int64_t wait() {
    std::lock_guard lock(mu_);
    {
      py::gil_scoped_release unlocked;
      while (queue_->outstanding() > 0 && reap(queue_->outstanding())) {
      }
    }
    int64_t finished = static_cast<int64_t>(done_ok_.size());
    done_ok_.clear();
    Status first;
    std::string first_path;
    for (auto& [id, o] : ops_) {
      ++finished;
      if (!o.error.ok() && first.ok()) {
        first = o.error;
        first_path = o.path;
      }
    }
    ops_.clear();
    if (!first.ok()) raise_status(first, first_path);
    return finished;
  }

  int64_t pending() {
    std::lock_guard lock(mu_);
    return static_cast<int64_t>(ops_.size());
  }

  // Closes every file the handle opened (after waiting for its requests).
  // Every file is detached and closed even when one close fails (fdatasync
  // on a full or failing disk): the handle then holds none, and the first
  // failure is raised after all of them.
  void close() {
    wait();
    std::lock_guard lock(mu_);
    Status first;
    std::string first_path;
    for (auto& [key, f] : files_) {
      Status detached = queue_->detach(f.slot);
      Status s = f.file.close();
      if (s.ok()) s = detached;
      if (!s.ok() && first.ok()) {
        first = s;
        first_path = key.path;
      }
    }
    files_.clear();
    if (first.code() == StatusCode::kInvalidArgument) {
      // A system call's EINVAL here (fdatasync on a file that cannot be
      // synced) is the file's failure, not a bad argument of the caller.
      const std::string m = std::string(status_code_name(first.code())) + ": " + std::string(first.message());
      PyErr_SetObject(PyExc_OSError, py::make_tuple(EINVAL, m, first_path).ptr());
      throw py::error_already_set();
    }
    if (!first.ok()) raise_status(first, first_path);
  }

 private:
  struct OpenFile {
    io::File file;
    int32_t slot = -1;
    uint64_t alignment = 1;
  };
  struct FileKey {
    std::string path;
    bool writable, direct;
    bool operator<(const FileKey& o) const {
      return std::tie(path, writable, direct) < std::tie(o.path, o.writable, o.direct);
    }
  };
  struct Op {
    std::string path;
    int64_t pieces = 0;
    Status error;
  };

  OpenFile& open(const std::string& path, bool write, bool direct) {
    FileKey key{path, write, direct};
    if (auto it = files_.find(key); it != files_.end()) return it->second;
    // A file opened for writing serves reads too.
    if (!write) {
      if (auto it = files_.find(FileKey{path, true, direct}); it != files_.end()) return it->second;
    }
    io::FileOptions fo;
    fo.create = write;
    fo.writable = write;
    fo.direct = direct ? direct_ : io::DirectMode::kOff;
    Result<io::File> f = io::File::open(path, fo);
    if (!f) raise_status(f.error(), path);
    OpenFile of;
    of.alignment = f->direct() ? f->alignment() : 1;
    Result<int32_t> slot = queue_->attach(f->fd(), path, of.alignment);
    if (!slot) raise_status(slot.error(), path);
    of.slot = *slot;
    of.file = std::move(*f);
    return files_.emplace(key, std::move(of)).first->second;
  }

  // Reaps at least min_results results into the ops' outcomes. False when
  // the queue itself failed: every op still open carries that error.
  bool reap(size_t min_results) {
    results_.clear();
    Result<size_t> n = queue_->wait(min_results, results_);
    if (!n) {
      for (auto& [id, o] : ops_) {
        if (o.error.ok()) o.error = n.error();
      }
      return false;
    }
    for (const io::IoResult& r : results_) {
      auto it = ops_.find(r.tag);
      if (it == ops_.end()) continue;
      if (!r.status.ok() && it->second.error.ok()) it->second.error = r.status;
    }
    return true;
  }

  uint64_t block_size_;
  io::DirectMode direct_;
  std::unique_ptr<io::BlockDevice> device_;
  std::unique_ptr<io::IoQueue> queue_;
  std::map<FileKey, OpenFile> files_;
  std::map<uint64_t, Op> ops_;
  std::vector<uint64_t> done_ok_;  // empty requests, finished at once
  std::vector<io::IoResult> results_;
  uint64_t next_id_ = 0;
  std::mutex mu_;
};

// A page-aligned, zero-filled host buffer of `bytes` bytes as a NumPy uint8
// array that owns it; locked in RAM (mlock) when asked — an error naming
// RLIMIT_MEMLOCK where the limit refuses.
py::array aligned_buffer(uint64_t bytes, bool lock) {
  io::AlignedAllocator allocator(lock);
  Result<io::Buffer> b = allocator.allocate(std::max<uint64_t>(bytes, 1), 4096);
  if (!b) raise_status(b.error());
  auto* owned = new io::Buffer(std::move(*b));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<io::Buffer*>(p); });
  return py::array(py::dtype("uint8"), {static_cast<py::ssize_t>(bytes)}, {1}, owned->data(), free_when_done);
}

void add_aio(py::module_& m) {
  py::class_<AioHandle>(m, "AioHandle")
      .def(py::init<uint64_t, uint32_t, int, const std::string&, const std::string&>(), py::arg("block_size"),
           py::arg("queue_depth"), py::arg("intra_op_parallelism"), py::arg("direct"), py::arg("backend"))
      .def("pwrite",
           [](AioHandle& h, uintptr_t address, uint64_t bytes, const std::string& path, int64_t offset) {
             return h.submit(io::IoOp::kWrite, address, bytes, path, offset);
           })
      .def("pread",
           [](AioHandle& h, uintptr_t address, uint64_t bytes, const std::string& path, int64_t offset) {
             return h.submit(io::IoOp::kRead, address, bytes, path, offset);
           })
      .def("wait", &AioHandle::wait)
      .def("pending", &AioHandle::pending)
      .def("close", &AioHandle::close)
      .def_property_readonly("backend", &AioHandle::backend);
  m.def("aligned_buffer", &aligned_buffer, py::arg("bytes"), py::arg("lock"));
}

}  // namespace strata::python
