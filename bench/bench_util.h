// What every benchmark records about the machine it ran on (STYLE.md §9).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace strata::bench {

std::string cpu_model();
// {"cpu": ..., "kernel": ..., "cores": ...}
nlohmann::json system_info();

}  // namespace strata::bench
