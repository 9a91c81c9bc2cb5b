// The host memory a session allocates for its chunks, by kind: the one
// count behind the session's check before it allocates (host_bytes_needed:
// sizes as they are, a lower bound) and the planner's host tier (each I/O
// buffer rounded to whole 4 KiB pages, as the pinned pools and the swap
// store's alignment make them). What the model allocates beside the session
// (the GPT's activation staging) the planner adds itself.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/tiers.h"

namespace strata::engine {

struct HostCountInput {
  std::vector<int64_t> chunk_elems;  // every registered chunk
  uint64_t element_bytes = 2;        // a working weight's and a gradient's (the precision)
  // Per chunk, for a model with chunks in another type (its weights and
  // gradient in RAM: with NVMe weights or gradients every chunk has the
  // precision). Empty: element_bytes for every chunk.
  std::vector<uint64_t> chunk_element_bytes;
  uint64_t element_bytes_of(size_t chunk) const {
    return chunk_element_bytes.empty() ? element_bytes : chunk_element_bytes.at(chunk);
  }
  int64_t grad_accum = 1;
  bool delayed_update = false;
  Tier weights = Tier::kHost;  // between uses: kHost (a resident model's too) or kNvme
  Tier states = Tier::kHost;   // kHost or kNvme
  bool speculate_in_ram = false;
  bool gradients_on_nvme = false;
  int gradient_buffers = kGradientBuffers;
  int staging_buffers = kStateStagingBuffers;
  int prefetch_depth = 1;
  int64_t state_piece_elems = 0;
  // The fp32 master weights and Adam states of this many parameters.
  std::function<uint64_t(int64_t elems)> state_bytes;
  // Rounds an I/O buffer up to what is allocated; null: as it is.
  std::function<uint64_t(uint64_t bytes)> pad;
};

struct HostCount {
  uint64_t model_states = 0;  // weights, gradients and their sums, states in RAM
  uint64_t io_buffers = 0;    // NVMe staging, the weights' read buffers, the gradient rings
  uint64_t total() const { return model_states + io_buffers; }
};

HostCount count_host_bytes(const HostCountInput& in);

}  // namespace strata::engine
