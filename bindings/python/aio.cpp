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

#include <pybind11/stl.h>

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

#include "common/check.h"
#include "io/buffer.h"
#include "io/device_factory.h"
#include "io/file.h"
#include "io/io_queue.h"

namespace py = pybind11;

namespace strata::python {
namespace {

// A failed Status on its way to Python. The handle's calls run with the
// GIL released (a thread waiting on the disk must not stop the others), so
// they cannot set a Python error themselves: they throw this, and the
// translator registered in add_aio raises FileNotFoundError,
// PermissionError, ValueError or OSError (errno, message, path) once the
// GIL is held again.
struct AioError {
  Status status;
  std::string path;
  bool os_error = false;  // an OSError whatever the code (a system call's EINVAL)
};

[[noreturn]] void raise_status(const Status& s, const std::string& path = "") { throw AioError{s, path}; }

void set_python_error(const AioError& e) {
  const Status& s = e.status;
  const std::string m = std::string(status_code_name(s.code())) + ": " + std::string(s.message());
  PyObject* type = PyExc_OSError;
  int err = EIO;
  if (e.os_error) {
    err = EINVAL;
  } else if (s.code() == StatusCode::kNotFound) {
    type = PyExc_FileNotFoundError;
    err = ENOENT;
  } else if (s.code() == StatusCode::kFailedPrecondition) {
    type = PyExc_PermissionError;
    err = EACCES;
  } else if (s.code() == StatusCode::kInvalidArgument) {
    PyErr_SetString(PyExc_ValueError, m.c_str());
    return;
  } else if (s.code() == StatusCode::kResourceExhausted) {
    err = ENOSPC;
  }
  PyErr_SetObject(type, py::make_tuple(err, m, e.path).ptr());
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
    if (block_size == 0 || block_size > io::kMaxRequestBytes) {
      throw py::value_error("block_size: expected 1 byte up to 1 GiB, got " + std::to_string(block_size));
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
  // `sync`: the caller waits for this request itself (wait_for), and wait()
  // leaves it to that caller. Any block size is taken: where the pieces
  // would not keep O_DIRECT's alignment the request goes through the page
  // cache (direct="prefer") or is refused ("require").
  uint64_t submit(io::IoOp op, uintptr_t address, uint64_t bytes, const std::string& path, int64_t offset,
                  bool sync) {
    std::lock_guard lock(mu_);
    if (offset < 0) throw py::value_error("offset: expected >= 0, got " + std::to_string(offset));
    const uint64_t id = ++next_id_;
    if (bytes == 0) {
      ops_[id] = Op{path, sync};
      return id;
    }
    const auto aligned_to = [&](uint64_t a) {
      return address % a == 0 && static_cast<uint64_t>(offset) % a == 0 && bytes % a == 0 &&
             (block_size_ % a == 0 || bytes <= block_size_);
    };
    bool direct = direct_ != io::DirectMode::kOff && aligned_to(4096);
    if (direct_ == io::DirectMode::kRequire && !aligned_to(4096)) {
      throw py::value_error(
          std::string(io::io_op_name(op)) + " " + path + ": address, offset (" + std::to_string(offset) +
          "), length (" + std::to_string(bytes) + ") and block size (" + std::to_string(block_size_) +
          ") must be multiples of 4096 for O_DIRECT (direct=\"require\"); direct=\"prefer\" takes any");
    }
    OpenFile& f = open(path, op == io::IoOp::kWrite, direct);
    if (f.alignment > 1 && !aligned_to(f.alignment)) {
      if (direct_ == io::DirectMode::kRequire) {
        throw py::value_error(path + ": the filesystem wants O_DIRECT requests aligned to " +
                              std::to_string(f.alignment) + " bytes");
      }
      direct = false;
    }
    OpenFile& target = direct ? f : open(path, op == io::IoOp::kWrite, /*direct=*/false);
    Op& o = ops_[id];
    o.path = path;
    o.sync = sync;
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
        if (o.remaining > 0) {  // the pieces queued finish first; the wait raises this
          o.error = s;
          break;
        }
        ops_.erase(id);
        raise_status(s, path);
      }
      ++o.remaining;
      if (!sync) ++async_pieces_;
    }
    return id;
  }

  // Waits for the one request `id` (queued with sync); returns 1, or raises
  // its failure. Other threads' requests finish on the way and wait for
  // their own callers.
  int64_t wait_for(uint64_t id) {
    std::lock_guard lock(mu_);
    auto it = ops_.find(id);
    STRATA_CHECK(it != ops_.end() && it->second.sync);
    while (it->second.remaining > 0 && reap(it->second.remaining)) {
    }
    const Op o = std::move(it->second);
    ops_.erase(it);
    if (!o.error.ok()) raise_status(o.error, o.path);
    return 1;
  }

  // Waits for every request queued without sync (by any thread); returns
  // how many finished. Raises the first failure's error, after all of them
  // have finished.
  int64_t wait() {
    std::lock_guard lock(mu_);
    for (uint64_t left = async_pieces(); left > 0 && reap(left); left = async_pieces()) {
    }
    int64_t finished = 0;
    Status first;
    std::string first_path;
    for (auto it = ops_.begin(); it != ops_.end();) {
      if (it->second.sync) {
        ++it;
        continue;
      }
      ++finished;
      if (!it->second.error.ok() && first.ok()) {
        first = it->second.error;
        first_path = it->second.path;
      }
      async_pieces_ -= it->second.remaining;  // non-zero only after the queue itself failed
      it = ops_.erase(it);
    }
    if (!first.ok()) raise_status(first, first_path);
    return finished;
  }

  // The requests queued without sync and not yet waited for.
  std::vector<uint64_t> pending_ids() {
    std::lock_guard lock(mu_);
    std::vector<uint64_t> ids;
    for (const auto& [id, o] : ops_) {
      if (!o.sync) ids.push_back(id);
    }
    return ids;
  }

  // Closes every file the handle opened, once every request in flight (any
  // thread's) has finished; their outcomes stay for wait() and wait_for().
  // Every file is detached and closed even when one close fails (fdatasync
  // on a full or failing disk): the handle then holds none, and the first
  // failure is raised after all of them.
  void close() {
    std::lock_guard lock(mu_);
    while (queue_->outstanding() > 0 && reap(queue_->outstanding())) {
    }
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
    // A system call's EINVAL here (fdatasync on a file that cannot be
    // synced) is the file's failure, not a bad argument of the caller.
    if (!first.ok()) throw AioError{first, first_path, first.code() == StatusCode::kInvalidArgument};
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
    bool sync = false;
    uint64_t remaining = 0;  // pieces queued and not yet reaped
    Status error;
  };

  // Pieces of requests queued without sync and not yet reaped: what
  // wait() must reap at least (kept, not summed over ops_ per reap).
  uint64_t async_pieces() const { return async_pieces_; }

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
      if (it->second.remaining > 0) {
        --it->second.remaining;
        if (!it->second.sync) --async_pieces_;
      }
      if (!r.status.ok() && it->second.error.ok()) it->second.error = r.status;
    }
    return true;
  }

  uint64_t block_size_;
  io::DirectMode direct_;
  std::unique_ptr<io::BlockDevice> device_;
  std::unique_ptr<io::IoQueue> queue_;
  std::map<FileKey, OpenFile> files_;
  std::map<uint64_t, Op> ops_;  // every request queued and not yet waited for
  std::vector<io::IoResult> results_;
  uint64_t next_id_ = 0;
  uint64_t async_pieces_ = 0;
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

// Every call of a handle runs with the GIL released and takes the handle's
// lock only then: a thread holding the lock never waits for the GIL, so
// threads sharing one handle cannot deadlock (wait() once re-took the GIL
// under the lock while submit() took the lock under the GIL).
void add_aio(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const AioError& e) {
      set_python_error(e);
    }
  });
  using unlocked = py::call_guard<py::gil_scoped_release>;
  py::class_<AioHandle>(m, "AioHandle")
      .def(py::init<uint64_t, uint32_t, int, const std::string&, const std::string&>(), py::arg("block_size"),
           py::arg("queue_depth"), py::arg("intra_op_parallelism"), py::arg("direct"), py::arg("backend"))
      .def(
          "pwrite",
          [](AioHandle& h, uintptr_t address, uint64_t bytes, const std::string& path, int64_t offset, bool sync) {
            return h.submit(io::IoOp::kWrite, address, bytes, path, offset, sync);
          },
          unlocked())
      .def(
          "pread",
          [](AioHandle& h, uintptr_t address, uint64_t bytes, const std::string& path, int64_t offset, bool sync) {
            return h.submit(io::IoOp::kRead, address, bytes, path, offset, sync);
          },
          unlocked())
      .def("wait", &AioHandle::wait, unlocked())
      .def("wait_for", &AioHandle::wait_for, py::arg("id"), unlocked())
      .def("pending_ids", &AioHandle::pending_ids, unlocked())
      .def("close", &AioHandle::close, unlocked())
      .def_property_readonly("backend", &AioHandle::backend);
  m.def("aligned_buffer", &aligned_buffer, py::arg("bytes"), py::arg("lock"));
}

}  // namespace strata::python
