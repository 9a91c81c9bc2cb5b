#include "models/gpt/gpt_config_keys.h"

#include <nlohmann/json.hpp>

namespace strata::engine {

ModelKeys gpt_config_keys(GptShape* shape) {
  return [shape](ConfigReader& m, ConfigReader& batch) -> Status {
    gpt::GptConfig& g = shape->model;
    std::string preset;
    STRATA_RETURN_IF_ERROR(m.get_choice("preset", &preset, {"gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"}));
    if (!preset.empty()) g = gpt::gpt2_config(preset.substr(5));
    STRATA_RETURN_IF_ERROR(m.get_int("layers", &g.layers, 1, 4096));
    STRATA_RETURN_IF_ERROR(m.get_int("hidden", &g.hidden, 1, 1 << 20));
    STRATA_RETURN_IF_ERROR(m.get_int("heads", &g.heads, 1, 1 << 16));
    STRATA_RETURN_IF_ERROR(m.get_int("vocab", &g.vocab, 2, 1 << 24));
    STRATA_RETURN_IF_ERROR(m.get_int("max_seq", &g.max_seq, 1, 1 << 20));
    STRATA_RETURN_IF_ERROR(g.validate().with_context("config key model"));
    STRATA_RETURN_IF_ERROR(batch.get_int("seq", &shape->seq, 1, 1 << 20));
    if (shape->seq > g.max_seq) {
      return invalid_argument("config key batch.seq: " + std::to_string(shape->seq) + " exceeds model.max_seq " +
                              std::to_string(g.max_seq));
    }
    return ok_status();
  };
}

Result<GptRunConfig> parse_gpt_config(const nlohmann::json& json, std::vector<std::string>* warnings,
                                      const std::vector<std::string>& nvme_paths, std::set<std::string>* keys_asked,
                                      ConfigUse use) {
  GptRunConfig c;
  STRATA_ASSIGN_OR_RETURN(c.engine,
                          parse_config(json, warnings, nvme_paths, keys_asked, gpt_config_keys(&c.gpt), use));
  return c;
}

Result<GptRunConfig> load_gpt_config(const std::string& path, std::vector<std::string>* warnings,
                                     const std::vector<std::string>& nvme_paths, ConfigUse use) {
  GptRunConfig c;
  STRATA_ASSIGN_OR_RETURN(c.engine, load_config(path, warnings, nvme_paths, gpt_config_keys(&c.gpt), use));
  return c;
}

}  // namespace strata::engine
