// The NUMA node of a PCI device, from sysfs (the same source hwloc reads
// for its PCI objects), for placing pinned memory and optimizer threads on
// the node nearest the GPU.
#include <cctype>
#include <fstream>

#include "gpu/device_info.h"

namespace strata::gpu {

int numa_node_of_pci(const std::string& pci_bus_id, const std::string& root) {
  std::string id = pci_bus_id;
  for (char& ch : id) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::ifstream in(root + "/" + id + "/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node >= 0 ? node : -1;
}

}  // namespace strata::gpu
