// What every benchmark records about the machine it ran on.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata::bench {

std::string cpu_model();
// {"cpu": ..., "kernel": ..., "cores": ...}
nlohmann::json system_info();

// Benchmarks stop at the first failure: prints "program: status" and exits 1.
void exit_on_error(const Status& status, std::string_view program);

// The median of v (the upper one of an even count).
double median(std::vector<double> v);

// Median wall seconds of `reps` runs of fn, after one untimed warm-up run.
double median_seconds(int reps, const std::function<void()>& fn);

// The same for several functions measured side by side: after one warm-up
// run of each, `reps` rounds that run each once (round r starts with
// function r mod count), so each median comes from the same stretch of
// time — on a shared machine whose speed drifts, a ratio of two of them
// drifts far less than one of timings taken one after the other. An empty
// function is not run; its median is infinity.
std::vector<double> interleaved_median_seconds(int reps, const std::vector<std::function<void()>>& fns);
// The same rounds, every timed run kept: each function's seconds in round
// order (none for an empty function).
std::vector<std::vector<double>> interleaved_round_seconds(int reps, const std::vector<std::function<void()>>& fns);
// Each function's median of those rounds (infinity where it has none).
std::vector<double> round_medians(const std::vector<std::vector<double>>& rounds);

}  // namespace strata::bench
