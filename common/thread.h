// Naming the calling thread (Linux): names show in top -H, gdb, perf and
// /proc/<pid>/task/*/comm.
#pragma once

#include <string_view>

namespace strata {

// Names the calling thread; Linux keeps the first 15 bytes.
void name_this_thread(std::string_view name);

}  // namespace strata
