// strata-planbench: how long the planner takes to answer, on the configs
// that once took seconds to minutes (a 354M-parameter GPT at micro-batch
// 4096 and 2^20, which fit nowhere, so the planner also searches for the
// nearest setup that fits) and on seeded random valid setups. The baseline,
// timed in the same run: one cost estimate of one placement — the ratio says
// how many estimates' worth of work an answer took.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/units.h"
#include "engine/plan.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/gpt_plan_model.h"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;

struct Case {
  std::string name;
  engine::TrainSetup setup;
  engine::Budgets budgets;
  engine::Constraints fixed;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

engine::TrainSetup medium_at(int64_t micro_batch) {
  engine::TrainSetup s;
  s.model = engine::gpt_plan_model(gpt::gpt2_config("medium"), 1024);
  s.micro_batch = micro_batch;
  s.host_backend = true;
  return s;
}

int64_t log_uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  std::uniform_real_distribution<double> u(std::log(static_cast<double>(lo)), std::log(static_cast<double>(hi)));
  return std::clamp<int64_t>(static_cast<int64_t>(std::exp(u(rng))), lo, hi);
}

// A setup the config parser accepts: each field within its key's range.
Case random_case(std::mt19937_64& rng, int index) {
  Case c;
  c.name = "random " + std::to_string(index);
  engine::TrainSetup& s = c.setup;
  gpt::GptConfig m;
  m.layers = log_uniform(rng, 1, 256);
  m.heads = log_uniform(rng, 1, 64);
  m.hidden = m.heads * (rng() % 2 ? 64 : 128);
  m.vocab = log_uniform(rng, 2, 1 << 17);
  m.max_seq = log_uniform(rng, 1, 1 << 14);
  s.model = engine::gpt_plan_model(m, log_uniform(rng, 1, m.max_seq));
  s.micro_batch = log_uniform(rng, 1, 1 << 20);
  s.grad_accum = log_uniform(rng, 1, 1 << 20);
  s.host_backend = rng() % 2 == 0;
  s.state_bytes_per_param = std::vector<double>{8, 4, 2.03}[rng() % 3];
  c.budgets.device_bytes = static_cast<uint64_t>(log_uniform(rng, int64_t{1} << 26, int64_t{1} << 37));
  c.budgets.host_bytes = static_cast<uint64_t>(log_uniform(rng, int64_t{1} << 30, int64_t{1} << 40));
  c.budgets.nvme_bytes = rng() % 2 ? static_cast<uint64_t>(log_uniform(rng, int64_t{1} << 30, int64_t{1} << 42)) : 0;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata-planbench: the planner's answer time on hard and random setups"};
  int random_cases = 100;
  uint64_t seed = 1;
  app.add_option("--random", random_cases, "random valid setups to plan")->check(CLI::Range(0, 100000));
  app.add_option("--seed", seed, "seed of the random setups");
  CLI11_PARSE(app, argc, argv);

  std::vector<Case> cases;
  const engine::Budgets tight{uint64_t{8} << 30, uint64_t{16} << 30, 0};
  cases.push_back({"354M, micro-batch 4096", medium_at(4096), tight, {}});
  cases.push_back({"354M, micro-batch 2^20", medium_at(int64_t{1} << 20), tight, {}});
  engine::Budgets with_nvme = tight;
  with_nvme.nvme_bytes = uint64_t{2} << 40;
  cases.push_back({"354M, micro-batch 2^20, NVMe", medium_at(int64_t{1} << 20), with_nvme, {}});
  std::mt19937_64 rng(seed);
  for (int i = 0; i < random_cases; ++i) cases.push_back(random_case(rng, i));

  // The baseline: one estimate of the first setup's default placement.
  engine::Placement one;
  const int kEstimates = 1000;
  const Clock::time_point t0 = Clock::now();
  double sink = 0;
  for (int i = 0; i < kEstimates; ++i) sink += engine::estimate(cases[0].setup, one, engine::Bandwidths{}).step_seconds;
  const double estimate_s = seconds_since(t0) / kEstimates;

  std::printf("strata-planbench on %s (seed %llu)\n", bench::cpu_model().c_str(), static_cast<unsigned long long>(seed));
  std::printf("one estimate: %.2f us\n", estimate_s * 1e6);
  std::printf("%-32s %10s %12s  %s\n", "setup", "seconds", "x estimate", "answer");
  std::vector<double> times;
  nlohmann::json rows = nlohmann::json::array();
  for (const Case& c : cases) {
    const Clock::time_point t = Clock::now();
    Result<engine::Plan> plan = engine::make_plan(c.setup, c.budgets, engine::Bandwidths{}, c.fixed);
    const double s = seconds_since(t);
    times.push_back(s);
    std::string answer = plan ? plan->why : std::string(status_code_name(plan.error().code()));
    if (answer.size() > 60) answer = answer.substr(0, 57) + "...";
    if (c.name.rfind("random", 0) != 0 || s > 0.1) {
      std::printf("%-32s %10.4f %12.0f  %s\n", c.name.c_str(), s, s / estimate_s, answer.c_str());
    }
    rows.push_back({{"setup", c.name}, {"seconds", s}, {"fits", plan.has_value()}});
  }
  std::vector<double> random_times(times.begin() + 3, times.end());
  const double worst = *std::max_element(times.begin(), times.end());
  std::printf("random setups: %zu, median %.4f s, slowest %.4f s; slowest of all %.4f s\n", random_times.size(),
              random_times.empty() ? 0.0 : bench::median(random_times),
              random_times.empty() ? 0.0 : *std::max_element(random_times.begin(), random_times.end()), worst);
  nlohmann::json out = {{"benchmark", "planbench"},       {"system", bench::system_info()}, {"seed", seed},
                        {"estimate_seconds", estimate_s}, {"slowest_seconds", worst},      {"rows", rows},
                        {"sink", sink}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
