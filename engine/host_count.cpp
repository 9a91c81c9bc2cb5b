#include "engine/host_count.h"

#include <algorithm>

namespace strata::engine {

HostCount count_host_bytes(const HostCountInput& in) {
  auto pad = [&in](uint64_t bytes) { return in.pad ? in.pad(bytes) : bytes; };
  const uint64_t es = in.element_bytes;
  // What the optimizer reads a gradient as: its fp32 sum when accumulating.
  const uint64_t grad_bytes = in.grad_accum > 1 ? 4 : es;
  // The delayed update's second set: of what its update reads and of the weights.
  const uint64_t sets = in.delayed_update ? 2 : 1;
  HostCount h;
  for (size_t c = 0; c < in.chunk_elems.size(); ++c) {
    const int64_t elems = in.chunk_elems[c];
    const auto n = static_cast<uint64_t>(elems);
    const uint64_t ces = in.element_bytes_of(c);
    if (!in.gradients_on_nvme) {
      h.model_states += (in.grad_accum > 1 ? 1 : sets) * ces * n;  // the gradient's host buffer
      if (in.grad_accum > 1) h.model_states += sets * 4 * n;       // its fp32 sum
    }
    if (in.weights != Tier::kNvme) h.model_states += sets * ces * n;  // the working weights
    // The states in RAM, and with speculation there their second copy.
    if (in.states == Tier::kHost) h.model_states += (in.speculate_in_ram ? 2 : 1) * in.state_bytes(elems);
  }
  if (in.states != Tier::kNvme || in.chunk_elems.empty()) return h;
  // The optimizer stage's staging buffers, each one piece's state, weights
  // (on NVMe) and gradient (on NVMe).
  const int64_t piece = max_state_piece(in.chunk_elems, in.state_piece_elems);
  const auto p = static_cast<uint64_t>(piece);
  const uint64_t per_buffer = pad(in.state_bytes(piece)) + (in.weights == Tier::kNvme ? pad(es * p) : 0) +
                              (in.gradients_on_nvme ? pad(grad_bytes * p) : 0);
  h.io_buffers += static_cast<uint64_t>(in.staging_buffers) * per_buffer;
  const auto largest = static_cast<uint64_t>(*std::max_element(in.chunk_elems.begin(), in.chunk_elems.end()));
  // The weights' read buffers (any chunk), which the copies to the device read.
  if (in.weights == Tier::kNvme) h.io_buffers += static_cast<uint64_t>(in.prefetch_depth + 3) * pad(es * largest);
  if (in.gradients_on_nvme) {
    // The rings: the gradients as they come, and their sums.
    const uint64_t sums = in.grad_accum > 1 ? pad(4 * largest) : 0;
    h.io_buffers += static_cast<uint64_t>(in.gradient_buffers) * (pad(es * largest) + sums);
  }
  return h;
}

}  // namespace strata::engine
