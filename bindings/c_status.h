// The C boundary's error handling, shared by every file of the C API: a
// Status becomes a strata_status and this thread's last error, and an
// exception never crosses into C.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <type_traits>

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

// A caller's struct is there (`struct_size` is its first field, NULL for
// none) and says how much of it there is: at least the size field itself.
inline Status check_struct_size(const char* call, const char* name, const size_t* struct_size) {
  if (struct_size == nullptr) return invalid_argument(std::string(call) + ": " + name + " is NULL");
  if (*struct_size >= sizeof(size_t)) return ok_status();
  return invalid_argument(std::string(call) + ": " + name + "->struct_size is " + std::to_string(*struct_size) +
                          "; set it with its _INIT initialiser (sizeof the struct)");
}

// The caller's struct (its first field struct_size) as this library's:
// the bytes the caller's size covers, the rest zero (the defaults of
// fields its header does not have). A newer caller's later fields must be
// zero: they ask for what this library cannot do.
template <class T>
Result<T> read_struct(const char* call, const char* name, const T* in) {
  static_assert(std::is_trivially_copyable_v<T> && offsetof(T, struct_size) == 0);
  STRATA_RETURN_IF_ERROR(check_struct_size(call, name, in == nullptr ? nullptr : &in->struct_size));
  const size_t size = in->struct_size;
  T out{};
  std::memcpy(static_cast<void*>(&out), in, std::min(size, sizeof(T)));
  const auto* bytes = reinterpret_cast<const unsigned char*>(in);
  for (size_t b = sizeof(T); b < size; ++b) {
    if (bytes[b] != 0) {
      return invalid_argument(std::string(call) + ": " + name + " sets a field at byte " + std::to_string(b) +
                              " that this library (struct of " + std::to_string(sizeof(T)) + " bytes) does not have");
    }
  }
  out.struct_size = sizeof(T);
  return out;
}

// `value` into the caller's struct: only the bytes its struct_size covers
// (struct_size itself is left as the caller set it).
template <class T>
Status write_struct(const char* call, const char* name, const T& value, T* out) {
  static_assert(std::is_trivially_copyable_v<T> && offsetof(T, struct_size) == 0);
  STRATA_RETURN_IF_ERROR(check_struct_size(call, name, out == nullptr ? nullptr : &out->struct_size));
  const size_t size = out->struct_size;
  const size_t n = std::min(size, sizeof(T));
  std::memcpy(reinterpret_cast<unsigned char*>(out) + sizeof(size_t),
              reinterpret_cast<const unsigned char*>(&value) + sizeof(size_t), n - sizeof(size_t));
  return ok_status();
}

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
