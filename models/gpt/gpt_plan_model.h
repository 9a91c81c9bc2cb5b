// The built-in GPT as the planner sees it (engine/plan_model.h): its
// chunks as gpt::model_layout pads them, its block inputs as saved
// activations, and its device bytes as SessionGpt allocates them.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/plan_model.h"
#include "models/gpt/gpt_config.h"

namespace strata::engine {

// A GPT of `config` trained on sequences of `seq` tokens (1..max_seq).
std::shared_ptr<const PlanModel> gpt_plan_model(const gpt::GptConfig& config, int64_t seq);

}  // namespace strata::engine
