// What every benchmark records about the machine it ran on (STYLE.md §9).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace strata::bench {

std::string cpu_model();
// {"cpu": ..., "kernel": ..., "cores": ...}
nlohmann::json system_info();

// Median wall seconds of `reps` runs of fn, after one untimed warm-up run.
double median_seconds(int reps, const std::function<void()>& fn);

}  // namespace strata::bench
