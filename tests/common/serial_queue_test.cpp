// SerialQueue runs tasks in order on its own thread, drain() waits for them
// and reports the first error, and the tasks queued behind a failure are
// dropped; the queue is reusable after a drain.
#include "common/serial_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace strata {
namespace {

TEST(SerialQueue, RunsTasksInOrderBesideTheCaller) {
  SerialQueue q("test queue");
  std::vector<int> seen;  // written by the worker only, read after drain()
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> elsewhere{true};
  for (int i = 0; i < 100; ++i) {
    q.submit([&, i] {
      if (std::this_thread::get_id() == caller) elsewhere = false;
      seen.push_back(i);
      return ok_status();
    });
  }
  ASSERT_TRUE(q.drain().ok());
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i);
  EXPECT_TRUE(elsewhere.load());
}

TEST(SerialQueue, TheFirstErrorIsReportedAndWhatFollowsItIsDropped) {
  SerialQueue q("test queue");
  std::atomic<int> ran{0};
  q.submit([&] { ++ran; return ok_status(); });
  q.submit([&] { ++ran; return data_loss("chunk 3 is corrupt"); });
  q.submit([&] { ++ran; return ok_status(); });
  q.submit([&] { ++ran; return internal_error("a second failure"); });
  Status s = q.drain();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(ran.load(), 2) << "tasks behind the failure ran";
  // Reusable: the error was reported once.
  q.submit([&] { ++ran; return ok_status(); });
  EXPECT_TRUE(q.drain().ok());
  EXPECT_EQ(ran.load(), 3);
  EXPECT_TRUE(q.drain().ok()) << "an empty drain";
}

}  // namespace
}  // namespace strata
