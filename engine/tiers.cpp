#include "engine/tiers.h"

#include <algorithm>
#include <string>

namespace strata::engine {

std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kNvme: return "nvme";
  }
  return "?";
}

std::vector<int64_t> state_piece_sizes(int64_t n, int64_t piece_elems) {
  if (piece_elems <= 0 || n <= piece_elems) return {n};
  const int64_t k = (n + piece_elems - 1) / piece_elems;
  const int64_t even = (n + k - 1) / k;
  const int64_t size = (even + kStatePieceGranule - 1) / kStatePieceGranule * kStatePieceGranule;
  std::vector<int64_t> sizes;
  for (int64_t left = n; left > 0; left -= size) sizes.push_back(std::min(size, left));
  return sizes;
}

Status check_state_piece_elems(int64_t piece_elems) {
  if (piece_elems == 0 || piece_elems >= kStatePieceGranule) return ok_status();
  return invalid_argument(std::to_string(piece_elems) + " parameters; 0 (whole chunks) or at least " +
                          std::to_string(kStatePieceGranule) + " (the optimizer's state pieces: sub_group_size)");
}

int64_t max_state_piece(const std::vector<int64_t>& chunk_elems, int64_t piece_elems) {
  int64_t m = 0;
  for (int64_t n : chunk_elems) {
    for (int64_t p : state_piece_sizes(n, piece_elems)) m = std::max(m, p);
  }
  return m;
}

}  // namespace strata::engine
