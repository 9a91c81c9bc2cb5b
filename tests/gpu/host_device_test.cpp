// HostDevice: the budget is hard and named, copies are real and ordered per
// stream, events order streams, streams really run concurrently, waiting
// threads that run a stream's tasks keep them in order and one at a time,
// and async failures surface.
#include "gpu/host/host_device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

namespace strata::gpu {
namespace {

std::unique_ptr<HostDevice> make(uint64_t capacity) {
  Result<std::unique_ptr<HostDevice>> d = HostDevice::create({capacity, 4, 64, 256});
  EXPECT_TRUE(d) << d.error().to_string();
  return std::move(d).value();
}

TEST(HostDevice, BudgetIsHardNamedAndTracked) {
  auto dev = make(1 << 20);
  Result<DeviceMemory> a = dev->allocate(600 * 1024, "block 0 weights");
  ASSERT_TRUE(a);
  EXPECT_EQ(dev->used_bytes(), 600u * 1024);
  Result<DeviceMemory> b = dev->allocate(600 * 1024, "block 1 weights");
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(b.error().message().find("device memory budget of 1.00 MiB"), std::string::npos) << b.error().message();
  EXPECT_NE(b.error().message().find("block 1 weights"), std::string::npos);
  EXPECT_EQ(dev->used_bytes(), 600u * 1024);  // the failed request took nothing
  { DeviceMemory gone = std::move(a).value(); }
  EXPECT_EQ(dev->used_bytes(), 0u);
  EXPECT_EQ(dev->peak_bytes(), 600u * 1024);
  Result<DeviceMemory> c = dev->allocate(1000, "small");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->bytes(), 1024u);  // rounded to the 256-byte allocation granule
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c->data()) % 256, 0u);
  EXPECT_EQ(HostDevice::create({0, 1, 1, 256}).error().code(), StatusCode::kInvalidArgument);
}

// kNoCap: a device limited only by the host's memory, still counting what
// it holds (the trainer's host backend without a device budget).
TEST(HostDevice, NoCapCountsButNeverRefuses) {
  Result<std::unique_ptr<HostDevice>> d = HostDevice::create({HostDeviceOptions::kNoCap, 4, 64, 256});
  ASSERT_TRUE(d) << d.error().to_string();
  EXPECT_EQ((*d)->capacity_bytes(), HostDeviceOptions::kNoCap);
  {
    Result<DeviceMemory> a = (*d)->allocate(64 << 20, "big");
    ASSERT_TRUE(a) << a.error().to_string();
    Result<DeviceMemory> b = (*d)->allocate(64 << 20, "bigger");
    ASSERT_TRUE(b) << b.error().to_string();
    EXPECT_EQ((*d)->used_bytes(), 128u << 20);
  }
  EXPECT_EQ((*d)->used_bytes(), 0u);
  EXPECT_EQ((*d)->peak_bytes(), 128u << 20);
}

TEST(HostDevice, CopiesAreOrderedOnAStreamAndChecked) {
  auto dev = make(1 << 20);
  Result<DeviceMemory> mem = dev->allocate(4096 * 4, "buf");
  ASSERT_TRUE(mem);
  Result<Stream> s = dev->create_stream("copy");
  ASSERT_TRUE(s);
  std::vector<float> src(4096), dst(4096, -1.0f);
  std::iota(src.begin(), src.end(), 0.0f);
  ASSERT_TRUE(dev->copy_to_device(*s, mem->data(), src.data(), 4096 * 4).ok());
  ASSERT_TRUE(dev->enqueue(*s, [&] {
                   for (int i = 0; i < 4096; ++i) mem->as<float>()[i] *= 2;
                   return ok_status();
                 }).ok());
  ASSERT_TRUE(dev->copy_to_host(*s, dst.data(), mem->data(), 4096 * 4).ok());
  ASSERT_TRUE(dev->synchronize(*s).ok());
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(dst[i], 2.0f * i);
  // A range outside any allocation is refused before anything runs.
  std::vector<float> host(8);
  Status bad = dev->copy_to_device(*s, host.data(), src.data(), 32);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dev->copy_to_host(*s, dst.data(), mem->as<char>() + 8, 4096 * 4).code(), StatusCode::kInvalidArgument);
  // Device to device, in the stream's order; both ends checked.
  Result<DeviceMemory> other = dev->allocate(4096 * 4, "other");
  ASSERT_TRUE(other);
  ASSERT_TRUE(dev->copy_on_device(*s, other->data(), mem->data(), 4096 * 4).ok());
  std::fill(dst.begin(), dst.end(), -1.0f);
  ASSERT_TRUE(dev->copy_to_host(*s, dst.data(), other->data(), 4096 * 4).ok());
  ASSERT_TRUE(dev->synchronize(*s).ok());
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(dst[i], 2.0f * i);
  EXPECT_EQ(dev->copy_on_device(*s, host.data(), mem->data(), 32).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dev->copy_on_device(*s, other->data(), host.data(), 32).code(), StatusCode::kInvalidArgument);
}

TEST(HostDevice, EventsOrderStreamsAndStreamsRunConcurrently) {
  auto dev = make(1 << 20);
  Stream compute = *dev->create_stream("compute");
  Stream copy = *dev->create_stream("copy");
  // The compute task can only finish once the copy stream has run: if the
  // streams were one queue this would never complete.
  std::promise<void> copy_ran;
  std::future<void> copy_ran_f = copy_ran.get_future();
  std::atomic<bool> saw_copy{false};
  ASSERT_TRUE(dev->enqueue(compute, [&] {
                   saw_copy = copy_ran_f.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
                   return ok_status();
                 }).ok());
  ASSERT_TRUE(dev->enqueue(copy, [&] {
                   copy_ran.set_value();
                   return ok_status();
                 }).ok());
  Event e = *dev->record(compute);
  ASSERT_TRUE(dev->synchronize(e).ok());
  EXPECT_TRUE(dev->done(e));
  EXPECT_TRUE(saw_copy.load());
  // stream_wait: work on `copy` after the wait sees what `compute` wrote before the event.
  std::atomic<int> value{0};
  std::promise<void> gate;
  std::shared_future<void> gate_f = gate.get_future().share();
  ASSERT_TRUE(dev->enqueue(compute, [&, gate_f] {
                   gate_f.wait();
                   value = 42;
                   return ok_status();
                 }).ok());
  Event written = *dev->record(compute);
  ASSERT_TRUE(dev->stream_wait(copy, written).ok());
  std::atomic<int> seen{-1};
  ASSERT_TRUE(dev->enqueue(copy, [&] {
                   seen = value.load();
                   return ok_status();
                 }).ok());
  EXPECT_FALSE(dev->done(written));
  gate.set_value();
  ASSERT_TRUE(dev->synchronize(copy).ok());
  EXPECT_EQ(seen.load(), 42);
}

// Threads waiting for a stream run its queued tasks themselves when its
// thread has not started them: still one task at a time, in submission
// order, whichever thread runs each.
TEST(HostDevice, WaitersRunQueuedTasksInOrderOneAtATime) {
  auto dev = make(1 << 20);
  Stream s = *dev->create_stream("busy");
  constexpr int kBatches = 100, kBatch = 30;  // two batches (and their events) fit the 64-task queue
  std::vector<int> order;
  order.reserve(kBatches * kBatch);
  std::atomic<int> active{0}, overlapped{0};
  std::mutex mu;  // guards ran_on and events
  std::set<std::thread::id> ran_on;
  std::vector<Event> events;
  // Three threads wait on the events as they are recorded, while the queue drains.
  std::vector<std::thread> waiters;
  for (int w = 0; w < 3; ++w) {
    waiters.emplace_back([&, w] {
      for (size_t k = static_cast<size_t>(w); k < kBatches; k += 3) {
        Event e;
        for (;;) {
          {
            std::lock_guard lock(mu);
            if (events.size() > k) {
              e = events[k];
              break;
            }
          }
          std::this_thread::yield();
        }
        EXPECT_TRUE(dev->synchronize(e).ok());
      }
    });
  }
  for (int b = 0; b < kBatches; ++b) {
    if (b >= 2) {
      Event older;
      {
        std::lock_guard lock(mu);
        older = events[static_cast<size_t>(b - 2)];
      }
      EXPECT_TRUE(dev->synchronize(older).ok());  // keeps the queue within its bound
    }
    for (int j = 0; j < kBatch; ++j) {
      const int i = b * kBatch + j;
      EXPECT_TRUE(dev->enqueue(s, [&, i] {
                       if (active.fetch_add(1) != 0) ++overlapped;
                       // A few microseconds of work: two tasks running at once would overlap here.
                       const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(5);
                       while (std::chrono::steady_clock::now() < until) {
                       }
                       order.push_back(i);  // safe only if tasks never overlap
                       {
                         std::lock_guard lock(mu);
                         ran_on.insert(std::this_thread::get_id());
                       }
                       active.fetch_sub(1);
                       return ok_status();
                     }).ok());
    }
    Event e = *dev->record(s);
    std::lock_guard lock(mu);
    events.push_back(e);
  }
  for (std::thread& t : waiters) t.join();
  ASSERT_TRUE(dev->synchronize(s).ok());
  EXPECT_EQ(overlapped.load(), 0) << "two tasks of one stream ran at once";
  ASSERT_EQ(order.size(), static_cast<size_t>(kBatches * kBatch));
  for (int i = 0; i < kBatches * kBatch; ++i) ASSERT_EQ(order[static_cast<size_t>(i)], i) << "out of order";
  std::printf("tasks ran on %zu threads\n", ran_on.size());
}

TEST(HostDevice, AsyncFailuresSurfaceOnceAndQueuesAreBounded) {
  auto dev = make(1 << 20);
  Stream s = *dev->create_stream("work");
  ASSERT_TRUE(dev->enqueue(s, [] { return data_loss("checksum mismatch in chunk 3"); }).ok());
  ASSERT_TRUE(dev->synchronize(s).ok());
  Status err = dev->async_error();
  EXPECT_EQ(err.code(), StatusCode::kDataLoss);
  EXPECT_NE(err.message().find("stream 'work'"), std::string::npos) << err.to_string();
  EXPECT_TRUE(dev->async_error().ok());  // reported once
  // The worker takes a task that blocks until `gate`, and says it has started,
  // so the queue behind it then fills deterministically.
  std::promise<void> gate, started;
  std::shared_future<void> g = gate.get_future().share();
  ASSERT_TRUE(dev->enqueue(s, [g, &started] {
                   started.set_value();
                   g.wait();
                   return ok_status();
                 }).ok());
  started.get_future().wait();
  Status last;
  int accepted = 0;
  for (int i = 0; i < 100 && last.ok(); ++i) {
    last = dev->enqueue(s, [] { return ok_status(); });
    accepted += last.ok();
  }
  EXPECT_EQ(last.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(accepted, 64);  // max_queued
  Result<Event> full = dev->record(s);  // a full queue refuses new events too...
  EXPECT_FALSE(full);
  gate.set_value();  // ...but synchronize needs no slot
  ASSERT_TRUE(dev->synchronize(s).ok());
  EXPECT_EQ(dev->create_stream("a").has_value() && dev->create_stream("b").has_value() &&
                dev->create_stream("c").has_value(),
            true);
  EXPECT_EQ(dev->create_stream("too many").error().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace strata::gpu
