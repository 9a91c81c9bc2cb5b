#include "common/units.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>

namespace strata {

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

uint64_t available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return static_cast<uint64_t>(kib) * kKiB;
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", value, kNames[unit]);
  }
  return buf;
}

bool parse_bytes(const std::string& text, uint64_t* out) {
  size_t i = 0;
  uint64_t value = 0;
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    uint64_t next = value * 10 + static_cast<uint64_t>(text[i] - '0');
    if (next / 10 != value) return false;  // overflow
    value = next;
    ++i;
  }
  std::string suffix = text.substr(i);
  for (char& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  uint64_t scale = 1;
  if (suffix.empty() || suffix == "b") {
    scale = 1;
  } else if (suffix == "k" || suffix == "kib" || suffix == "kb") {
    scale = kKiB;
  } else if (suffix == "m" || suffix == "mib" || suffix == "mb") {
    scale = kMiB;
  } else if (suffix == "g" || suffix == "gib" || suffix == "gb") {
    scale = kGiB;
  } else if (suffix == "t" || suffix == "tib" || suffix == "tb") {
    scale = 1024 * kGiB;
  } else {
    return false;
  }
  if (value != 0 && (value * scale) / scale != value) return false;
  *out = value * scale;
  return true;
}

}  // namespace strata
