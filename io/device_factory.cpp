#include "io/device_factory.h"

#include <string>

#include "common/log.h"
#include "io/pread_device.h"
#include "io/uring_device.h"

namespace strata::io {

Result<std::unique_ptr<BlockDevice>> make_block_device(const DeviceOptions& options) {
  if (options.backend != Backend::kPosix) {
    UringOptions uring;
    uring.queue_depth = options.queue_depth;
    Result<std::unique_ptr<UringDevice>> dev = UringDevice::create(uring);
    if (dev) return std::unique_ptr<BlockDevice>(std::move(dev).value());
    if (options.backend == Backend::kUring) return std::move(dev).error();
    log_notice("io_uring unavailable (" + dev.error().to_string() + "); using the POSIX pread/pwrite backend");
  }
  PreadOptions posix;
  posix.queue_depth = options.queue_depth;
  posix.threads = options.posix_threads;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<PreadDevice> dev, PreadDevice::create(posix));
  return std::unique_ptr<BlockDevice>(std::move(dev));
}

Result<Backend> parse_backend(std::string_view text) {
  if (text == "auto") return Backend::kAuto;
  if (text == "uring" || text == "io_uring") return Backend::kUring;
  if (text == "posix") return Backend::kPosix;
  return invalid_argument("unknown I/O backend '" + std::string(text) + "' (allowed: auto, uring, posix)");
}

std::string_view backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kUring: return "uring";
    case Backend::kPosix: return "posix";
  }
  return "?";
}

}  // namespace strata::io
