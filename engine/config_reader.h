// ConfigReader: one JSON object of a config, read key by key. It remembers
// which keys were used, so finish() can warn about the rest by their dotted
// path; its errors are InvalidArgument naming the key and what is allowed.
// The engine reads its keys with it, and a model its own (engine/config.h:
// ModelKeys), so both speak the same way about a config.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::engine {

class ConfigReader {
 public:
  // `obj` must outlive the reader. `warnings` receives the warnings;
  // `asked` (optional) the path of every key asked about, present or not:
  // the keys docs/CONFIG.md must document.
  ConfigReader(const nlohmann::json& obj, std::string path, std::vector<std::string>* warnings,
               std::set<std::string>* asked);

  std::string key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  // A key whose value is "auto" counts as absent: Hugging Face's Trainer
  // writes "auto" into DeepSpeed configs and fills it in before DeepSpeed
  // reads them, so a config taken from there has them; the default stands,
  // and a warning names the key. (get_choice with "auto" among the allowed
  // values takes it as a value.)
  bool has(const std::string& key);
  // The value of a present key, marked used.
  const nlohmann::json& raw(const std::string& key);

  // Each leaves *out as it is when the key is absent.
  Status get_int(const std::string& key, int64_t* out, int64_t lo, int64_t hi);
  // A count that DeepSpeed configs often write as a float (1e9): any
  // integral number in lo..hi.
  Status get_count(const std::string& key, int64_t* out, int64_t lo, int64_t hi);
  Status get_double(const std::string& key, double* out, double lo, double hi);
  Status get_bool(const std::string& key, bool* out);
  Status get_choice(const std::string& key, std::string* out, const std::vector<std::string>& allowed);
  // "24GiB", "512MiB", or a number of bytes, at least `min_bytes`.
  Status get_bytes(const std::string& key, uint64_t* out, uint64_t min_bytes = 0);
  // A present key's object.
  Result<ConfigReader> object(const std::string& key);

  // A warning about the object as a whole.
  void warn(const std::string& what) { warnings_->push_back(what); }
  // Marks a key as understood but not used, with a warning saying why.
  void ignore(const std::string& key, const std::string& why);
  // Warns about every key of the object that was not used.
  void finish() const;
  // Where this reader reports (for a reader of the same config).
  std::vector<std::string>* warnings() const { return warnings_; }
  std::set<std::string>* asked() const { return asked_; }

 private:
  Status bad(const std::string& key, const std::string& allowed, const nlohmann::json& got) const;

  const nlohmann::json* obj_;
  std::string path_;
  std::vector<std::string>* warnings_;
  std::set<std::string>* asked_;
  std::set<std::string> used_;
};

}  // namespace strata::engine
