#include "bench/bench_util.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
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

nlohmann::json system_info() {
  utsname uts{};
  ::uname(&uts);
  return {{"cpu", cpu_model()}, {"kernel", uts.release}, {"cores", ::sysconf(_SC_NPROCESSORS_ONLN)}};
}

void exit_on_error(const Status& status, std::string_view program) {
  if (status.ok()) return;
  std::fflush(stdout);  // what was printed before the error comes before it, also when stdout is a pipe
  std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(program.size()), program.data(), status.to_string().c_str());
  std::exit(1);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double median_seconds(int reps, const std::function<void()>& fn) {
  return interleaved_median_seconds(reps, {fn})[0];
}

std::vector<std::vector<double>> interleaved_round_seconds(int reps, const std::vector<std::function<void()>>& fns) {
  const size_t k = fns.size();
  for (const auto& fn : fns) {
    if (fn) fn();
  }
  std::vector<std::vector<double>> t(k);
  for (int r = 0; r < reps; ++r) {
    for (size_t j = 0; j < k; ++j) {
      const size_t i = (static_cast<size_t>(r) + j) % k;
      if (!fns[i]) continue;
      auto t0 = std::chrono::steady_clock::now();
      fns[i]();
      t[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  return t;
}

std::vector<double> round_medians(const std::vector<std::vector<double>>& rounds) {
  std::vector<double> medians(rounds.size(), std::numeric_limits<double>::infinity());
  for (size_t i = 0; i < rounds.size(); ++i) {
    if (!rounds[i].empty()) medians[i] = median(rounds[i]);
  }
  return medians;
}

std::vector<double> interleaved_median_seconds(int reps, const std::vector<std::function<void()>>& fns) {
  return round_medians(interleaved_round_seconds(reps, fns));
}

}  // namespace strata::bench
