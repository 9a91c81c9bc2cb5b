// Naming and placing the calling thread (Linux). Names show in top -H, gdb,
// perf and /proc/<pid>/task/*/comm; placement keeps the host backend's
// compute apart from the threads that feed it.
#pragma once

#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata {

// Names the calling thread; Linux keeps the first 15 bytes.
void name_this_thread(std::string_view name);

// Binds the calling thread to the given CPUs (ids as in /proc/cpuinfo).
// An empty list is a no-op. Errors name the CPUs and the reason.
Status bind_this_thread(const std::vector<int>& cpus);

// The CPUs the calling thread may run on now.
std::vector<int> allowed_cpus();

}  // namespace strata
