// The built-in GPT's keys in a config: "model" (a GPT-2 preset, then its
// shape key by key) and "batch.seq", read by the GPT through the engine's
// reader (engine/config.h: ModelKeys), so the core parses no model's keys.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/config.h"
#include "models/gpt/gpt_config.h"

namespace strata::engine {

// The GPT's shape and sequence length; the defaults stand for keys absent.
struct GptShape {
  gpt::GptConfig model = gpt::gpt2_config("small");
  int64_t seq = 1024;
};

// Reads the GPT's keys into *shape (which must outlive the call).
// InvalidArgument naming the key for a shape the GPT cannot take, or a
// sequence longer than model.max_seq.
ModelKeys gpt_config_keys(GptShape* shape);

// A config of a run of the built-in GPT: the engine's keys and the GPT's.
struct GptRunConfig {
  EngineConfig engine;
  GptShape gpt;
};

// parse_config / load_config (engine/config.h) with the GPT's keys.
Result<GptRunConfig> parse_gpt_config(const nlohmann::json& json, std::vector<std::string>* warnings,
                                      const std::vector<std::string>& nvme_paths = {},
                                      std::set<std::string>* keys_asked = nullptr,
                                      ConfigUse use = ConfigUse::kRun);
Result<GptRunConfig> load_gpt_config(const std::string& path, std::vector<std::string>* warnings,
                                     const std::vector<std::string>& nvme_paths = {},
                                     ConfigUse use = ConfigUse::kRun);

}  // namespace strata::engine
