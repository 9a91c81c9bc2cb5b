// The trainer's budgets are held before anything is allocated: a run that
// needs far more host memory than its budget is refused by the planner's
// count, naming the budget, the need and a placement that would fit, while
// the process's resident memory has not grown toward the need.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "common/units.h"
#include "models/gpt/trainer.h"
#include "tests/models/gpt/trainer_runs.h"

namespace strata::engine {
namespace {

// This process's peak resident set since the last reset_peak_resident()
// (VmHWM in /proc/self/status): what a refusal after allocating would have
// grown to, even though it frees everything before it returns.
uint64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
  }
  return 0;
}

// Writing 5 to clear_refs resets VmHWM to the current resident set.
bool reset_peak_resident() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.close();
  return static_cast<bool>(clear);
}

// 8 blocks of hidden 1024: about 101M parameters, 1.6 GiB of host memory
// with the states in RAM, against a host budget of 128 MiB.
TrainerOptions big_against_a_small_host() {
  TrainerOptions o = testing::tiny(1);
  o.model.layers = 8, o.model.hidden = 1024, o.model.heads = 16, o.model.vocab = 256, o.model.max_seq = 16;
  o.host_budget_bytes = 128 * kMiB;
  return o;
}

TEST(TrainerBudgets, AHostBudgetFarBelowTheNeedIsRefusedBeforeMemoryGrows) {
  const TrainerOptions o = big_against_a_small_host();
  const uint64_t need = estimate(training_setup(o), run_placement(o), Bandwidths{}).host.total();
  ASSERT_GT(need, 10 * o.host_budget_bytes) << "the run must need far more than its budget";
  if (!reset_peak_resident()) GTEST_SKIP() << "/proc/self/clear_refs cannot be written: no peak to measure";
  const uint64_t before = peak_resident_bytes();
  ASSERT_GT(before, 0u) << "no VmHWM in /proc/self/status";
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  const uint64_t after = peak_resident_bytes();
  ASSERT_FALSE(tr) << "a run needing " << format_bytes(need) << " was built within " << format_bytes(o.host_budget_bytes);
  EXPECT_EQ(tr.error().code(), StatusCode::kResourceExhausted);
  const std::string m(tr.error().message());
  EXPECT_NE(m.find("budgets.host is 128.00 MiB"), std::string::npos) << m;
  EXPECT_NE(m.find("needs " + format_bytes(need)), std::string::npos) << m;
  EXPECT_NE(m.find("before allocating"), std::string::npos) << m;
  // Not one of the run's model-state buffers was touched: at its peak the
  // process grew by far less than a tenth of what the run needs.
  std::printf("peak resident before %s, during and after %s; the run needs %s\n", format_bytes(before).c_str(),
              format_bytes(after).c_str(), format_bytes(need).c_str());
  EXPECT_LT(after, before + need / 10) << "peak resident memory grew from " << format_bytes(before) << " to "
                                        << format_bytes(after);
}

// The refusal names the way out: with NVMe paths, the planner's placement
// within the same budgets (the states there).
TEST(TrainerBudgets, TheRefusalNamesAPlacementThatFits) {
  TrainerOptions o = big_against_a_small_host();
  o.host_budget_bytes = 1 * kGiB;
  o.nvme_paths = {"/tmp"};
  o.nvme_budget_bytes = 64 * kGiB;
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  ASSERT_FALSE(tr);
  const std::string m(tr.error().message());
  EXPECT_NE(m.find("the planner's placement within these budgets: "), std::string::npos) << m;
  EXPECT_NE(m.find("optimizer states on nvme"), std::string::npos) << m;
}

// Each budget on its own: the device's cap when the weights stream.
TEST(TrainerBudgets, ADeviceBudgetBelowTheNeedIsRefusedByName) {
  TrainerOptions o = big_against_a_small_host();
  o.host_budget_bytes = 0;  // no host budget
  o.stream_weights = true;
  o.device_bytes = 4 * kMiB;  // less than one block's weights
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  ASSERT_FALSE(tr);
  EXPECT_EQ(tr.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(tr.error().message()).find("budgets.device is 4.00 MiB"), std::string::npos)
      << tr.error().message();
}

}  // namespace
}  // namespace strata::engine
