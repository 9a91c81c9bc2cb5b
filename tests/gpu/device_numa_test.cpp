// The NUMA node of a PCI device is read from sysfs: a fake sysfs tree gives
// the node it holds (the bus id matched case-insensitively), -1 where the
// kernel says -1 (one node) or the device is absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "gpu/device_info.h"
#include "tests/test_util.h"

namespace strata::gpu {
namespace {

TEST(DeviceNuma, ReadsTheNodeOfAPciDevice) {
  strata::testing::TempDir root;
  auto device = [&](const std::string& id, const std::string& node) {
    std::filesystem::create_directories(root.path() + "/" + id);
    std::ofstream(root.path() + "/" + id + "/numa_node") << node << "\n";
  };
  device("0000:3b:00.0", "1");
  device("0000:af:00.0", "-1");
  EXPECT_EQ(numa_node_of_pci("0000:3b:00.0", root.path()), 1);
  EXPECT_EQ(numa_node_of_pci("0000:3B:00.0", root.path()), 1) << "bus ids are matched in lower case";
  EXPECT_EQ(numa_node_of_pci("0000:af:00.0", root.path()), -1) << "the kernel's -1: no node to prefer";
  EXPECT_EQ(numa_node_of_pci("0000:01:00.0", root.path()), -1) << "no such device";
}

}  // namespace
}  // namespace strata::gpu
