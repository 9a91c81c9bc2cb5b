// Chooses and builds the BlockDevice for a config: io_uring by default,
// falling back to the POSIX pread/pwrite pool — with a one-line notice — when
// io_uring cannot be set up (old kernel, seccomp, io_uring_disabled sysctl).
#pragma once

#include <memory>
#include <string_view>

#include "io/block_device.h"

namespace strata::io {

enum class Backend { kAuto, kUring, kPosix };

struct DeviceOptions {
  Backend backend = Backend::kAuto;
  uint32_t queue_depth = 32;
  uint32_t posix_threads = 4;
};

Result<std::unique_ptr<BlockDevice>> make_block_device(const DeviceOptions& options);

// "auto" | "uring" | "posix"
Result<Backend> parse_backend(std::string_view text);
std::string_view backend_name(Backend backend);

}  // namespace strata::io
