// The C boundary's error handling, shared by every file of the C API: a
// Status becomes a strata_status and this thread's last error, and an
// exception never crosses into C.
#pragma once

#include <new>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "bindings/include/strata/strata.h"
#include "common/status.h"

namespace strata::bindings {

// This thread's last error message (strata_last_error).
std::string& last_error();

inline strata_status report(const Status& s) {
  last_error() = s.ok() ? std::string() : s.to_string();
  return static_cast<strata_status>(static_cast<int>(s.code()));
}

// A config's text from C as JSON (comments allowed); errors begin with
// `call`.
Result<nlohmann::json> parse_config_text(const char* call, const char* config_json);

// `s` into the caller's `text` of `capacity` bytes, NUL-terminated and
// truncated as snprintf does; its full length into *length (optional).
// InvalidArgument for a NULL `text` with a capacity.
Status copy_text(const char* call, const std::string& s, char* text, size_t capacity, size_t* length);

// Runs `body` (returning a Status), turning exceptions into errors.
template <class Body>
strata_status guarded(Body&& body) {
  try {
    return report(body());
  } catch (const std::bad_alloc&) {
    return report(resource_exhausted("strata: out of memory"));
  } catch (const std::exception& e) {
    return report(internal_error(std::string("strata: ") + e.what()));
  }
}

}  // namespace strata::bindings
