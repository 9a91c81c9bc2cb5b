// What compute devices this build can see. The CUDA backend fills this in
// when strata is built with CUDA; a CPU-only build reports none. Tests and
// tools use it to skip GPU work with a reason instead of failing.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace strata::gpu {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  uint64_t memory_bytes = 0;
  std::string pci_bus_id;  // "0000:3b:00.0", as sysfs names it
};

// The NUMA node a PCI device hangs off (sysfs' numa_node under `root`, by
// default /sys/bus/pci/devices/<bus id>/), or -1 when the machine does not
// say (one node, or no such device).
int numa_node_of_pci(const std::string& pci_bus_id, const std::string& root = "/sys/bus/pci/devices");

// True when this binary contains the CUDA backend.
bool built_with_cuda();

// The CUDA devices present. Unavailable (with the driver's reason) when CUDA
// is built in but no usable GPU/driver is present; Unimplemented in a
// CPU-only build.
Result<std::vector<CudaDeviceInfo>> cuda_devices();

}  // namespace strata::gpu
