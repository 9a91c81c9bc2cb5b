#include "gpu/calibrate.h"

#include <chrono>
#include <memory>
#include <vector>


namespace strata::gpu {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<double> measure_copy_rate(Device& device, uint64_t bytes, double min_seconds) {
  if (bytes == 0) return invalid_argument("measure_copy_rate: bytes must be > 0");
  STRATA_ASSIGN_OR_RETURN(DeviceMemory dst, device.allocate(bytes, "calibration copy"));
  STRATA_ASSIGN_OR_RETURN(Stream s, device.create_stream("calibration copies"));
  std::vector<uint8_t> host(bytes, 1);
  STRATA_RETURN_IF_ERROR(device.copy_to_device(s, dst.data(), host.data(), bytes));  // warm-up
  STRATA_RETURN_IF_ERROR(device.synchronize(s));
  int64_t copies = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    STRATA_RETURN_IF_ERROR(device.copy_to_device(s, dst.data(), host.data(), bytes));
    STRATA_RETURN_IF_ERROR(device.synchronize(s));
    ++copies;
    elapsed = seconds_since(t0);
  } while (elapsed < min_seconds);
  return static_cast<double>(bytes) * static_cast<double>(copies) / elapsed;
}

}  // namespace strata::gpu
