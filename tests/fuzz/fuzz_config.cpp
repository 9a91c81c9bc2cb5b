// Fuzzes the config parser and what a command line does with what it
// accepts: JSON text (comments allowed, as load_config takes it) ->
// parse_gpt_config -> trainer_options -> the planner on the budgets. Every
// input must end as a config or a Status: no exception, crash or hang (the
// planner answers any setup in milliseconds).
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/plan.h"
#include "models/gpt/trainer_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::engine;
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false,
                                                 /*ignore_comments=*/true);
  if (j.is_discarded()) return 0;
  std::vector<std::string> warnings;
  strata::Result<GptRunConfig> c = parse_gpt_config(j, &warnings);
  if (!c) return 0;
  strata::Result<TrainerOptions> o = trainer_options(*c);
  if (!o) return 0;
  const Budgets budgets = budgets_or_defaults(c->engine.budgets);
  strata::Result<Plan> plan = make_plan(training_setup(*o), budgets, Bandwidths{}, c->engine.constraints);
  if (plan) (void)format_plan(*plan, budgets);
  return 0;
}
