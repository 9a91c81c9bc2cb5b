#include "engine/config_reader.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/units.h"

namespace strata::engine {

using nlohmann::json;

namespace {

std::string number(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

}  // namespace

ConfigReader::ConfigReader(const json& obj, std::string path, std::vector<std::string>* warnings,
                           std::set<std::string>* asked)
    : obj_(&obj), path_(std::move(path)), warnings_(warnings), asked_(asked) {}

bool ConfigReader::has(const std::string& key) {
  if (asked_ != nullptr) asked_->insert(key_path(key));
  if (!obj_->contains(key)) return false;
  const json& v = obj_->at(key);
  if (v.is_string() && v.get<std::string>() == "auto") {
    if (used_.insert(key).second) {
      warnings_->push_back(key_path(key) +
                           ": \"auto\" (a placeholder Hugging Face's Trainer fills in): strata's "
                           "default is used");
    }
    return false;
  }
  return true;
}

const json& ConfigReader::raw(const std::string& key) {
  used_.insert(key);
  return obj_->at(key);
}

Status ConfigReader::get_int(const std::string& key, int64_t* out, int64_t lo, int64_t hi) {
  if (!has(key)) return ok_status();
  const json& v = raw(key);
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    return bad(key, "an integer in " + std::to_string(lo) + ".." + std::to_string(hi), v);
  }
  *out = v.get<int64_t>();
  return ok_status();
}

Status ConfigReader::get_count(const std::string& key, int64_t* out, int64_t lo, int64_t hi) {
  if (!has(key)) return ok_status();
  const json& v = raw(key);
  const double d = v.is_number() ? v.get<double>() : -1.0;
  if (!v.is_number() || d != std::floor(d) || d < static_cast<double>(lo) || d > static_cast<double>(hi)) {
    return bad(key, "a whole number in " + std::to_string(lo) + ".." + std::to_string(hi), v);
  }
  *out = static_cast<int64_t>(d);
  return ok_status();
}

Status ConfigReader::get_double(const std::string& key, double* out, double lo, double hi) {
  if (!has(key)) return ok_status();
  const json& v = raw(key);
  if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi)) {
    return bad(key, "a number in [" + number(lo) + ", " + number(hi) + "]", v);
  }
  *out = v.get<double>();
  return ok_status();
}

Status ConfigReader::get_bool(const std::string& key, bool* out) {
  if (!has(key)) return ok_status();
  const json& v = raw(key);
  if (!v.is_boolean()) return bad(key, "true or false", v);
  *out = v.get<bool>();
  return ok_status();
}

Status ConfigReader::get_choice(const std::string& key, std::string* out, const std::vector<std::string>& allowed) {
  const bool auto_is_a_value = std::find(allowed.begin(), allowed.end(), "auto") != allowed.end();
  if (asked_ != nullptr) asked_->insert(key_path(key));
  if (auto_is_a_value ? !obj_->contains(key) : !has(key)) return ok_status();
  const json& v = raw(key);
  std::string text = v.is_string() ? v.get<std::string>() : "";
  for (const std::string& a : allowed) {
    if (text == a) {
      *out = text;
      return ok_status();
    }
  }
  std::string list;
  for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
  return bad(key, "one of " + list, v);
}

Status ConfigReader::get_bytes(const std::string& key, uint64_t* out, uint64_t min_bytes) {
  if (!has(key)) return ok_status();
  const json& v = raw(key);
  uint64_t bytes = 0;
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) {
    bytes = v.get<uint64_t>();
  } else if (!v.is_string() || !parse_bytes(v.get<std::string>(), &bytes)) {
    return bad(key, "a byte count such as \"24GiB\", \"512MiB\" or 1073741824", v);
  }
  if (bytes < min_bytes) {
    return bad(key, "a byte count of at least " + std::to_string(min_bytes) + " (leave the key out for its default)",
               v);
  }
  *out = bytes;
  return ok_status();
}

Result<ConfigReader> ConfigReader::object(const std::string& key) {
  const json& v = raw(key);
  if (!v.is_object()) return bad(key, "an object", v);
  return ConfigReader(v, key_path(key), warnings_, asked_);
}

void ConfigReader::ignore(const std::string& key, const std::string& why) {
  if (!has(key)) return;
  used_.insert(key);
  warnings_->push_back(key_path(key) + ": " + why);
}

void ConfigReader::finish() const {
  for (const auto& [key, value] : obj_->items()) {
    if (used_.count(key) == 0) warnings_->push_back("unknown key " + key_path(key) + " ignored");
  }
}

Status ConfigReader::bad(const std::string& key, const std::string& allowed, const json& got) const {
  return invalid_argument("config key " + key_path(key) + ": expected " + allowed + ", got " + got.dump());
}

}  // namespace strata::engine
