// Byte units and alignment arithmetic. Sizes and offsets are uint64_t bytes.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;
inline constexpr uint64_t kGiB = 1024 * kMiB;

constexpr bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }
// `alignment` must be a power of two.
constexpr uint64_t round_up(uint64_t x, uint64_t alignment) { return (x + alignment - 1) & ~(alignment - 1); }
constexpr uint64_t round_down(uint64_t x, uint64_t alignment) { return x & ~(alignment - 1); }
constexpr bool is_aligned(uint64_t x, uint64_t alignment) { return (x & (alignment - 1)) == 0; }
inline bool is_aligned(const void* p, uint64_t alignment) {
  return is_aligned(reinterpret_cast<uintptr_t>(p), alignment);
}
constexpr uint64_t div_ceil(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// "1.50 GiB", "512 B".
std::string format_bytes(uint64_t bytes);
// Parses "4GiB", "512M", "1k", "4096" (K/M/G/T with or without "iB" are powers
// of 1024). Returns false on malformed input.
bool parse_bytes(const std::string& text, uint64_t* out);
// Physical memory of this machine, in bytes (0 if the system will not say).
uint64_t physical_memory_bytes();
// The memory the kernel says can be allocated without swapping
// (MemAvailable in /proc/meminfo), in bytes (0 if it will not say).
uint64_t available_memory_bytes();

}  // namespace strata
