// What the planner (plan.h) knows of a model, from the model itself: its
// chunks, and for a micro-batch what it keeps on the device, hands the
// session as saved activations and computes. The planner counts the
// session's own bytes (chunk store slots, host buffers, NVMe blobs) from
// the chunks; everything else comes from here. The built-in GPT's is
// models/gpt/gpt_plan_model.h; a model of a trainer's own implements one
// to be planned the same way.
//
// The step it describes: every chunk through the chunk store's slots,
// forward and then backward, or with resident_first (the session's
// option) chunk 0 on the device for the whole step with its gradient and
// the others forward 1..n-1 and back (the built-in GPT's). The planner's
// bytes, on every tier and on the links, hold for either.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "gpu/device.h"

namespace strata::engine {

// One pass of the model over `pass` micro-batches at once (the vertical
// order of accumulation; 1 otherwise) in a step of `grad_accum`.
struct ModelPass {
  int64_t micro_batch = 1;
  int64_t pass = 1;
  int64_t grad_accum = 1;
  DType compute = DType::kBF16;      // the device's storage type
  bool host_backend = false;         // the host backend (gpu/host) stands in for the device
  bool offload_activations = false;  // the saved activations go to the host or NVMe
};

// The model's device bytes beside the session's chunk store, each counted
// by the function its allocation is sized with.
struct ModelDeviceBytes {
  uint64_t working_set = 0;  // one block's working set: forward's saved tensors, backward's scratch
  uint64_t activations_kept = 0;  // saved activations kept on the device: all, or those in flight
  uint64_t step = 0;         // the rest of its workspace, the gradient flowing down, losses, inputs
  uint64_t resident = 0;  // beside a resident chunk 0 and its gradient (its gradients of a pass's other micro-batches)
  uint64_t total() const { return working_set + activations_kept + step + resident; }
};

// One micro-batch's saved activations.
struct ModelActivations {
  int64_t count = 0;   // kept for backward
  int64_t saved = 0;   // of them, handed to the session when offloaded (the rest never leave the device)
  uint64_t bytes = 0;  // each
};

class PlanModel {
 public:
  virtual ~PlanModel() = default;
  // Every chunk's elements as the model registers them (padding
  // included), in their order; at least one beside a resident chunk 0.
  virtual const std::vector<int64_t>& chunk_elems() const = 0;
  virtual int64_t parameters() const = 0;  // without the padding
  // Each chunk's working type where the model registers chunks in a type
  // of their own (Session::add_chunk's dtype), in chunk_elems' order;
  // empty: every chunk in the session's precision.
  virtual std::vector<DType> chunk_dtypes() const { return {}; }
  // Whether the model keeps chunk 0 on the device (SessionOptions::resident_first).
  virtual bool resident_first() const { return true; }
  // OK when the model runs micro-batches of this size; InvalidArgument
  // saying why not otherwise.
  virtual Status check(int64_t micro_batch) const = 0;
  // How plans name a micro-batch: "micro-batch 4 x 1024 tokens".
  virtual std::string micro_batch_text(int64_t micro_batch) const {
    return "micro-batch " + std::to_string(micro_batch);
  }
  virtual ModelActivations activations(int64_t micro_batch, DType compute) const = 0;
  virtual ModelDeviceBytes device_bytes(const ModelPass& pass) const = 0;
  // One micro-batch's forward and backward, the recomputed forward included.
  virtual double flops(int64_t micro_batch) const = 0;
  // The device's sustained FLOP rate on this model's compute, measured in
  // about `seconds` (calibrate.h). Unimplemented unless the model can.
  virtual Result<double> measure_flops(gpu::Device& device, DType compute, int64_t micro_batch, double seconds) const {
    (void)device, (void)compute, (void)micro_batch, (void)seconds;
    return unimplemented("this model does not measure its compute rate");
  }
};

}  // namespace strata::engine
