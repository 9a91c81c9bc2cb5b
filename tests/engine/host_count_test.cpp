// count_host_bytes is the one count of a session's host memory: the
// session's check before it allocates takes it as it is (a lower bound),
// the planner with every I/O buffer in whole pages. Over the placements a
// session runs, what a started session holds lies between the two.
#include "engine/host_count.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/session.h"
#include "tests/test_util.h"

namespace strata::engine {
namespace {

struct Case {
  Tier weights, states;
  bool grads_nvme, delayed, speculate;
  int64_t accum, piece;
  DType precision;
};

std::string text(const Case& c) {
  return "weights on " + std::string(tier_name(c.weights)) + ", states on " + std::string(tier_name(c.states)) +
         (c.grads_nvme ? ", gradients on nvme" : "") + (c.delayed ? ", delayed" : "") +
         (c.speculate ? ", speculating in RAM" : "") + ", grad_accum " + std::to_string(c.accum) + ", pieces " +
         std::to_string(c.piece) + ", " + std::string(dtype_name(c.precision));
}

TEST(HostCount, ASessionHoldsBetweenTheCountAndItsPagedBound) {
  strata::testing::TempDir dir;
  const std::vector<int64_t> chunks = {5000, 12345, 70000, 70000, 333};
  const std::vector<Case> cases = {
      {Tier::kHost, Tier::kHost, false, false, false, 1, 0, DType::kBF16},
      {Tier::kHost, Tier::kHost, false, false, true, 3, 0, DType::kF32},
      {Tier::kHost, Tier::kHost, false, true, false, 2, 0, DType::kF16},
      {Tier::kHost, Tier::kNvme, false, false, false, 1, 4096, DType::kBF16},
      {Tier::kNvme, Tier::kNvme, false, false, false, 3, 8192, DType::kBF16},
      {Tier::kNvme, Tier::kNvme, true, false, false, 1, 0, DType::kBF16},
      {Tier::kHost, Tier::kNvme, true, false, false, 4, 4096, DType::kF32},
      {Tier::kNvme, Tier::kNvme, false, true, false, 2, 0, DType::kF16},
  };
  int i = 0;
  for (const Case& c : cases) {
    SessionOptions o;
    o.weights = c.weights;
    o.states = c.states;
    o.gradients = c.grads_nvme ? Tier::kNvme : Tier::kHost;
    o.delayed_update = c.delayed;
    o.speculate_in_ram = c.speculate;
    o.grad_accum = c.accum;
    o.state_piece_elems = c.piece;
    o.precision = c.precision;
    o.pin_memory = false;
    o.nvme_paths = {dir.sub("c" + std::to_string(i++))};
    Result<std::unique_ptr<Session>> s = Session::create(o);
    ASSERT_TRUE(s) << text(c) << ": " << s.error().to_string();
    for (size_t k = 0; k < chunks.size(); ++k) {
      ASSERT_TRUE((*s)->add_chunk("c" + std::to_string(k), chunks[k], nullptr)) << text(c);
    }
    ASSERT_TRUE((*s)->start().ok()) << text(c);
    HostCountInput in = host_count_input(o, chunks);
    const uint64_t lower = count_host_bytes(in).total();
    in.pad = [](uint64_t b) { return (b + 4095) / 4096 * 4096; };
    const uint64_t upper = count_host_bytes(in).total();
    const uint64_t held = (*s)->host_bytes();
    EXPECT_LE(lower, held) << text(c);
    EXPECT_LE(held, upper) << text(c);
    std::printf("%-90s count %9llu, held %9llu, paged bound %9llu\n", text(c).c_str(),
                static_cast<unsigned long long>(lower), static_cast<unsigned long long>(held),
                static_cast<unsigned long long>(upper));
  }
}

}  // namespace
}  // namespace strata::engine
