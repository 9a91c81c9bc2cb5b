// Checks the CUDA runtime reports sane devices where a GPU exists; skips with
// the reason elsewhere.
#include "gpu/device_info.h"

#include <gtest/gtest.h>

namespace strata::gpu {
namespace {

TEST(DeviceInfo, ReportsDevicesOrWhyNot) {
  Result<std::vector<CudaDeviceInfo>> devices = cuda_devices();
  if (!built_with_cuda()) {
    ASSERT_FALSE(devices);
    EXPECT_EQ(devices.error().code(), StatusCode::kUnimplemented);
    GTEST_SKIP() << devices.error().message();
  }
  if (!devices) GTEST_SKIP() << "no usable GPU: " << devices.error().message();
  if (devices->empty()) GTEST_SKIP() << "no CUDA device present";
  for (const CudaDeviceInfo& d : *devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GE(d.compute_major, 7);
    EXPECT_GT(d.memory_bytes, 1ull << 30);
    EXPECT_EQ(d.pci_bus_id.size(), 12u) << d.pci_bus_id;  // dddd:bb:dd.f
    const int node = numa_node_of_pci(d.pci_bus_id);
    EXPECT_GE(node, -1);
  }
}

}  // namespace
}  // namespace strata::gpu
