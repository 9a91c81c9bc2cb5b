// Fuzzes the safetensors reader: the input is a whole file. Opening it,
// verifying every tensor (checksums and finiteness) and reading each one
// back must end as data or a Status, never a crash, a read out of bounds
// or an allocation beyond the file's size.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/checkpoint_io.h"

namespace {

// One scratch file per process, in $STRATA_TEST_DIR or /tmp.
const std::string& scratch_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("STRATA_TEST_DIR");
    return std::string(dir != nullptr ? dir : "/tmp") + "/strata-fuzz-safetensors-" + std::to_string(::getpid());
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::engine;
  const std::string& path = scratch_path();
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return 0;
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  strata::Result<SafetensorsReader> r = SafetensorsReader::open(path);
  if (r) {
    (void)r->verify([&](const TensorInfo& t, uint64_t offset, std::span<const std::byte> bytes) {
      return check_finite(path, t, offset, bytes);
    });
    for (const TensorInfo& t : r->tensors()) {
      std::vector<std::byte> bytes(static_cast<size_t>(t.bytes()));  // within the file: open() checked
      (void)r->read(t.name, bytes);
    }
  }
  ::unlink(path.c_str());
  return 0;
}
