#include "bench/bench_util.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <fstream>

namespace strata::bench {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

nlohmann::json system_info() {
  utsname uts{};
  ::uname(&uts);
  return {{"cpu", cpu_model()}, {"kernel", uts.release}, {"cores", ::sysconf(_SC_NPROCESSORS_ONLN)}};
}

}  // namespace strata::bench
