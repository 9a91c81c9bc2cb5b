#include "engine/trace.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace strata::engine {
namespace {

TEST(Trace, WritesChromeTraceJsonWithOneTrackPerStream) {
  strata::testing::TempDir dir;
  Trace trace(true);
  trace.span("compute stream", "block 3 forward", 10, 25, "kernel");
  trace.span("copy stream", "h2d block 4", 12, 20, "copy", 4096);
  { Trace::Scope s(trace, "nvme ring 0", "read m/v chunk 7", "nvme", 1 << 20); }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) trace.span("adam thread " + std::to_string(t), "update", i, i + 1, "optimizer");
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(trace.size(), 403u);
  std::string path = dir.path() + "/trace.json";
  ASSERT_TRUE(trace.write(path).ok());
  std::ifstream in(path);
  nlohmann::json doc = nlohmann::json::parse(in);
  const auto& ev = doc["traceEvents"];
  int metadata = 0, spans = 0;
  std::set<int> tids;
  for (const auto& e : ev) {
    if (e["ph"] == "M") {
      ++metadata;
      EXPECT_EQ(e["name"], "thread_name");
    } else {
      ++spans;
      ASSERT_EQ(e["ph"], "X");
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      tids.insert(e["tid"].get<int>());
    }
  }
  EXPECT_EQ(metadata, 7);  // compute, copy, nvme ring, 4 adam threads
  EXPECT_EQ(spans, 403);
  EXPECT_EQ(tids.size(), 7u);
  bool found_bytes = false;
  for (const auto& e : ev) found_bytes |= e.contains("args") && e["args"].contains("bytes") && e["args"]["bytes"] == 4096;
  EXPECT_TRUE(found_bytes);
}

TEST(Trace, BoundedAndFreeWhenOff) {
  Trace small(true, 10);
  for (int i = 0; i < 25; ++i) small.span("t", "e", i, i + 1);
  EXPECT_EQ(small.size(), 10u);
  EXPECT_EQ(small.dropped(), 15u);
  EXPECT_NE(small.to_json().find("dropped_events"), std::string::npos);
  Trace off(false);
  off.span("t", "e", 0, 1);
  { Trace::Scope s(off, "t", "e"); }
  EXPECT_EQ(off.size(), 0u);
  EXPECT_EQ(Trace(true).write("/nonexistent-dir/trace.json").code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace strata::engine
