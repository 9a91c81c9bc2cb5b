// Trace: records what every copy, kernel, optimizer call and NVMe request did
// and when, as a Chrome trace (JSON, opens in Perfetto or chrome://tracing):
// one track per stream / thread / ring. Recording is thread-safe and bounded
// (events beyond the limit are counted, not stored); with tracing off a
// record costs one branch.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::engine {

class Trace {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Trace(bool enabled, size_t max_events = 1 << 20);

  bool enabled() const { return enabled_; }
  // Microseconds since the trace began.
  double now_us() const;
  // A steady-clock time on this trace's microsecond axis.
  double us(Clock::time_point t) const;

  // A finished span on `track` ("compute stream", "nvme ring 0", "adam thread 1").
  void span(const std::string& track, const std::string& name, double start_us, double end_us,
            const std::string& category = "", uint64_t bytes = 0);

  size_t size() const;
  uint64_t dropped() const;

  // Writes {"traceEvents": [...]} to `path` (via a temporary file, renamed).
  Status write(const std::string& path) const;
  std::string to_json() const;

  // Records [construction, destruction) as a span.
  class Scope {
   public:
    Scope(Trace& trace, std::string track, std::string name, std::string category = "", uint64_t bytes = 0);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Trace& trace_;
    std::string track_, name_, category_;
    uint64_t bytes_;
    double start_us_;
  };

 private:
  struct Event {
    int track;
    std::string name;
    std::string category;
    double start_us;
    double dur_us;
    uint64_t bytes;
  };

  const bool enabled_;
  const size_t max_events_;
  const Clock::time_point origin_;
  mutable std::mutex mu_;
  std::map<std::string, int> tracks_;
  std::vector<Event> events_;
  uint64_t dropped_ = 0;
};

}  // namespace strata::engine
