#include "bench/bench_util.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <fstream>
#include <vector>

namespace strata::bench {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

nlohmann::json system_info() {
  utsname uts{};
  ::uname(&uts);
  return {{"cpu", cpu_model()}, {"kernel", uts.release}, {"cores", ::sysconf(_SC_NPROCESSORS_ONLN)}};
}

void exit_on_error(const Status& status, std::string_view program) {
  if (status.ok()) return;
  std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(program.size()), program.data(), status.to_string().c_str());
  std::exit(1);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double median_seconds(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(std::move(t));
}

}  // namespace strata::bench
