// Minimal logging to stderr for notices that must reach the user (a backend
// fallback, a cleanup failure). Dependency-free so common/ stays at the bottom.
// Thread-safe: each call writes one line with a single write().
#pragma once

#include <string_view>

namespace strata {

void log_notice(std::string_view message);
void log_warning(std::string_view message);

}  // namespace strata
