#include "engine/trace.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

namespace strata::engine {

Trace::Trace(bool enabled, size_t max_events) : enabled_(enabled), max_events_(max_events), origin_(Clock::now()) {}

double Trace::now_us() const { return us(Clock::now()); }

double Trace::us(Clock::time_point t) const { return std::chrono::duration<double, std::micro>(t - origin_).count(); }

void Trace::span(const std::string& track, const std::string& name, double start_us, double end_us,
                 const std::string& category, uint64_t bytes) {
  if (!enabled_) return;
  std::lock_guard lock(mu_);
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  auto [it, inserted] = tracks_.emplace(track, static_cast<int>(tracks_.size()) + 1);
  events_.push_back({it->second, name, category, start_us, end_us - start_us, bytes});
}

size_t Trace::size() const {
  std::lock_guard lock(mu_);
  return events_.size();
}

uint64_t Trace::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

std::string Trace::to_json() const {
  std::lock_guard lock(mu_);
  nlohmann::json events = nlohmann::json::array();
  // One named "thread" per track, all in process 1.
  for (const auto& [name, tid] : tracks_) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", tid}, {"args", {{"name", name}}}});
  }
  for (const Event& e : events_) {
    nlohmann::json ev = {{"ph", "X"}, {"name", e.name}, {"pid", 1}, {"tid", e.track}, {"ts", e.start_us},
                         {"dur", e.dur_us}};
    if (!e.category.empty()) ev["cat"] = e.category;
    if (e.bytes > 0) ev["args"] = {{"bytes", e.bytes}};
    events.push_back(std::move(ev));
  }
  nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  if (dropped_ > 0) doc["otherData"] = {{"dropped_events", dropped_}};
  return doc.dump();
}

Status Trace::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return failed_precondition("trace: cannot create " + tmp);
    out << to_json();
    out.flush();
    if (!out) return resource_exhausted("trace: writing " + tmp + " failed (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return errno_status(errno, "trace: rename " + tmp + " to " + path);
  return ok_status();
}

Trace::Scope::Scope(Trace& trace, std::string track, std::string name, std::string category, uint64_t bytes)
    : trace_(trace),
      track_(std::move(track)),
      name_(std::move(name)),
      category_(std::move(category)),
      bytes_(bytes),
      start_us_(trace.enabled() ? trace.now_us() : 0) {}

Trace::Scope::~Scope() {
  if (trace_.enabled()) trace_.span(track_, name_, start_us_, trace_.now_us(), category_, bytes_);
}

}  // namespace strata::engine
