// The tiers a view may live on and the constants the planner and the store
// must agree on: the number of pinned gradient and staging buffers and the
// optimizer stage's state pieces. Both the planner (plan.h) and what it
// counts (chunk_store.h, host_count.h) include this header, so neither
// includes the other's.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata::engine {

enum class Tier : uint8_t { kDevice, kHost, kNvme };
// "device", "host" or "nvme".
std::string_view tier_name(Tier tier);

// Pinned chunk buffers of the gradient ring when the gradients wait on
// NVMe (TrainerOptions::gradients): a chunk's gradient waits for a free one (the default).
inline constexpr int kGradientBuffers = 3;

// The optimizer stage's unit on NVMe: a chunk of n parameters in pieces of
// at most `piece_elems` (0: one piece), equal but the last, each a multiple
// of kStatePieceGranule — whole 8-bit blocks, and 2-byte weights on 8 KiB
// boundaries, so a chunk's weight pieces land aligned in one buffer.
inline constexpr int64_t kStatePieceGranule = 4096;
std::vector<int64_t> state_piece_sizes(int64_t n, int64_t piece_elems);
// OK for 0 (whole chunks) or at least kStatePieceGranule; InvalidArgument
// saying so otherwise (callers add where the value came from).
Status check_state_piece_elems(int64_t piece_elems);
// The largest piece of any of these chunks: what one staging buffer holds.
int64_t max_state_piece(const std::vector<int64_t>& chunk_elems, int64_t piece_elems);

// Pinned staging buffers of the optimizer stage with states on NVMe (each
// one piece's state: state_piece_sizes): one holds the write behind, the
// rest read ahead.
inline constexpr int kStateStagingBuffers = 4;
// Host staging buffers of saved activations on NVMe: two for writes
// in flight, two for prefetched reads (the session's).
inline constexpr int kActivationStagingBuffers = 4;

}  // namespace strata::engine
