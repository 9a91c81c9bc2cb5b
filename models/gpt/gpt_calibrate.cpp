#include "models/gpt/gpt_calibrate.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "models/gpt/gpt_ops_factory.h"

namespace strata::gpt {

using gpu::DeviceMemory;

Result<double> measure_block_flops(gpu::Device& device, const GptConfig& config, DType dtype, int64_t batch, int64_t seq,
                                   double min_seconds) {
  if (batch < 1 || seq < 1 || seq > config.max_seq) {
    return invalid_argument("measure_block_flops: needs batch >= 1 and 1 <= seq <= max_seq");
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<GptOps> ops, make_gpt_ops(device, config, dtype));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<GptOps::Workspace> ws, ops->workspace(batch, seq));
  const EndOffsets ends = end_offsets(config);
  const uint64_t elem = dtype_bytes(dtype);
  const uint64_t chunk = static_cast<uint64_t>(ends.block_numel) * elem;
  const uint64_t act = static_cast<uint64_t>(batch * seq * config.hidden) * elem;
  // Training cycles through every block's weights, so a wide model's
  // blocks come from memory, not the caches: the passes cycle through
  // copies of the block totalling at least kCycleBytes (at most 8 copies).
  constexpr uint64_t kCycleBytes = uint64_t{768} << 20;
  const uint64_t copies = std::clamp<uint64_t>((kCycleBytes + chunk - 1) / chunk, 1, 8);
  std::vector<DeviceMemory> blocks;
  for (uint64_t i = 0; i < copies; ++i) {
    STRATA_ASSIGN_OR_RETURN(DeviceMemory b, device.allocate(chunk, "calibration block"));
    blocks.push_back(std::move(b));
  }
  STRATA_ASSIGN_OR_RETURN(DeviceMemory dparams, device.allocate(chunk, "calibration gradient"));
  STRATA_ASSIGN_OR_RETURN(DeviceMemory x, device.allocate(4 * act, "calibration activations"));
  STRATA_ASSIGN_OR_RETURN(Stream s, device.create_stream("calibration"));
  // Small weights and inputs: finite values, so no path of the ops (a
  // non-finite check, a denormal) runs slower than in training.
  std::vector<uint8_t> host(std::max(chunk, act));
  auto fill = [&](uint64_t bytes) {
    for (uint64_t i = 0; i + 1 < bytes; i += 2) {
      const float v = 0.02f * static_cast<float>(static_cast<int>((i / 2) % 97) - 48) / 48.0f;
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      if (dtype == DType::kF32) {
        if (i % 4 == 0 && i + 3 < bytes) std::memcpy(&host[i], &v, 4);
      } else {
        const auto half = static_cast<uint16_t>(dtype == DType::kBF16 ? bits >> 16 : 0x2000 + (i % 97));
        std::memcpy(&host[i], &half, 2);
      }
    }
  };
  fill(chunk);
  for (const DeviceMemory& b : blocks) STRATA_RETURN_IF_ERROR(device.copy_to_device(s, b.data(), host.data(), chunk));
  fill(act);
  auto* xs = static_cast<uint8_t*>(x.data());
  STRATA_RETURN_IF_ERROR(device.copy_to_device(s, xs, host.data(), act));
  STRATA_RETURN_IF_ERROR(device.copy_to_device(s, xs + 2 * act, host.data(), act));  // dx_out
  STRATA_RETURN_IF_ERROR(device.synchronize(s));
  // One training pass of a block as the streamed model runs it: forward,
  // then forward again (the recompute) and backward.
  size_t next = 0;
  auto pass = [&]() -> Status {
    const void* params = blocks[next].data();
    next = (next + 1) % blocks.size();
    STRATA_RETURN_IF_ERROR(ops->block_forward(s, *ws, params, xs, xs + act));
    STRATA_RETURN_IF_ERROR(ops->block_forward(s, *ws, params, xs, xs + act));
    STRATA_RETURN_IF_ERROR(ops->block_backward(s, *ws, params, dparams.data(), xs, xs + 2 * act, xs + 3 * act));
    return device.synchronize(s);
  };
  STRATA_RETURN_IF_ERROR(pass());  // warm-up: first touches, library start-up
  int64_t passes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    STRATA_RETURN_IF_ERROR(pass());
    ++passes;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < min_seconds || passes < static_cast<int64_t>(blocks.size()));
  GptConfig one = config;
  one.layers = 1;
  one.vocab = 0;  // the block's FLOPs alone
  const double flops = training_flops_per_token(one, seq, /*recompute=*/true) * static_cast<double>(batch * seq);
  return flops * static_cast<double>(passes) / elapsed;
}

}  // namespace strata::gpt
