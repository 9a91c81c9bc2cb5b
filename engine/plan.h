// The placement planner: from the model (what it says of itself:
// plan_model.h), the batch shape and the budgets of each tier it chooses
// where every view lives — low-precision weights, gradients, fp32 master
// weights and optimizer states, activation
// saved activations — the prefetch depth and the number of device chunk buffers,
// and predicts the peak bytes of each tier and the time of each link per
// step. Users give budgets; the planner chooses, and says why.
//
// The cost model counts bytes per link per optimizer step and divides by
// each link's bandwidth (measured by the benchmarks, or defaults); with the
// step's parts overlapped, the predicted step time is the slowest link.
// Every byte the engine will allocate is in the estimate, by tier:
// model states, activations, chunk buffers and I/O buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "engine/plan_model.h"
#include "engine/tiers.h"

namespace strata::engine {

struct Placement;
// "weights on host, optimizer states on nvme, activations on device", as plans print it.
std::string placement_text(const Placement& placement);

struct TrainSetup {
  // The model, as it tells the planner its chunks and bytes (plan_model.h;
  // the built-in GPT's: models/gpt/gpt_plan_model.h). The planner reads it
  // (estimate, make_plan); check_placement only its chunks' types.
  std::shared_ptr<const PlanModel> model;
  int64_t micro_batch = 1;
  int64_t grad_accum = 1;
  DType compute = DType::kBF16;      // what the device computes in (and its gradients' type)
  DType working = DType::kBF16;      // the low-precision weights the optimizer writes (bf16 / fp16)
  // The host backend (gpu/host) stands in for the device: it computes in
  // fp32 whatever the storage type, so its workspace is larger.
  bool host_backend = false;
  // The opt-in delayed parameter update keeps a second set of the buffers
  // the optimizer reads its gradients from (TrainerOptions::delayed_update).
  bool delayed_update = false;
  // The vertical order of accumulation asked for (TrainerOptions::
  // vertical_accumulation, with grad_accum > 1): this many micro-batches
  // (a divisor of grad_accum) share each pass of the streamed model — their
  // saved activations and block gradients on the device at once, the weights
  // moved once per pass. 1: one at a time, unless the planner chooses
  // otherwise (Placement::micro_batches_per_pass).
  int64_t micro_batches_per_pass = 1;
  double state_bytes_per_param = 8;  // Adam m and v: 8 (fp32), 4 (bf16), ~2.03 (8-bit blockwise)
  // States on NVMe move in pieces of at most this many parameters
  // (state_piece_sizes; DeepSpeed's sub_group_size); 0: whole chunks.
  int64_t state_piece_elems = int64_t{1} << 25;
  // Chunk buffers of the gradient ring when the gradients wait on NVMe
  // (Placement::gradients; TrainerOptions::gradient_buffers).
  int gradient_buffers = kGradientBuffers;
  // Each chunk's working type, where a model registers chunks of their own
  // (Session::add_chunk's dtype); empty: the model's (PlanModel::
  // chunk_dtypes), or every chunk in `working`. Chunks of more than one
  // type keep their weights and gradients in RAM.
  std::vector<DType> chunk_dtypes;
};

// What the optimizer reads a chunk's gradient as: the device's gradient
// (TrainSetup::compute), or its fp32 sum over the micro-batches when
// accumulating — what the gradients on NVMe and a delayed update's second
// set of buffers hold.
inline DType optimizer_gradient_type(const TrainSetup& s) { return s.grad_accum > 1 ? DType::kF32 : s.compute; }

// Each chunk's working type: TrainSetup::chunk_dtypes, else the model's
// (PlanModel::chunk_dtypes); empty: all `working`. Whether some chunk's
// type is not the setup's.
std::vector<DType> chunk_dtypes_of(const TrainSetup& setup);
bool mixes_dtypes(const TrainSetup& setup);

// Whether the trainer keeps the gradients on NVMe for this setup
// (Placement::gradients): beside states on NVMe, in the exact schedule (no
// delayed update), with each chunk's micro-batches landing one after
// another — one a step, or all of them in one pass of the vertical order.
bool gradients_run_on_nvme(const TrainSetup& setup, Tier states, int64_t micro_batches_per_pass);

// The placement rules, written once: what the engine runs. The planner
// enumerates only placements this accepts, and the trainer and a session
// refuse the rest with its message (callers add who they are):
//   - the optimizer states on the host or on NVMe (the optimizer is the CPU's);
//   - the weights on NVMe only beside the states on NVMe, and never fp32;
//   - saved activations off the device only with the weights streamed;
//   - a second copy of the states in RAM (speculate_in_ram) only with them there;
//   - the gradients on the host, or on NVMe where gradients_run_on_nvme says;
//   - micro-batches per pass a divisor of grad_accum; prefetch depth 1..1024.
// InvalidArgument naming the rule and what the placement has.
Status check_placement(const TrainSetup& setup, const Placement& placement);

struct Budgets {
  uint64_t device_bytes = 0;
  uint64_t host_bytes = 0;  // host RAM for model states, pinned buffers and saved activations
  uint64_t nvme_bytes = 0;  // 0: no NVMe tier
};

// Link speeds the time prediction divides by. Defaults are conservative
// figures for a PCIe 4 GPU server; pass measured ones (strata-iobench,
// strata-adambench, gpu_check.sh) for real predictions.
struct Bandwidths {
  double h2d_gbps = 20;
  double d2h_gbps = 20;
  double nvme_read_gbps = 3;
  double nvme_write_gbps = 2;
  double cpu_optimizer_params_per_s = 1.5e9;
  double device_tflops = 100;  // sustained, for the training FLOPs with recompute
  // The device is the host's own cores (the host backend): its compute, its
  // copies (memcpy) and the CPU optimizer take turns on the same cores, so
  // their times add up; only NVMe transfers overlap them.
  bool shares_host_cores = false;
  // Where the figures come from ("defaults", "measured on ..."), for plans
  // and reports.
  std::string source = "defaults (a PCIe 4 GPU server)";
};

struct TierBytes {
  uint64_t model_states = 0;  // weights, gradients, master weights, optimizer states
  uint64_t activations = 0;   // saved activations and the working set of one block
  uint64_t buffers = 0;       // chunk buffers for streaming and gradient staging
  uint64_t io_buffers = 0;    // NVMe staging buffers, loss workspace
  uint64_t total() const { return model_states + activations + buffers + io_buffers; }
};

struct LinkTime {
  std::string link;
  double bytes = 0;  // per optimizer step (FLOPs for "compute")
  double seconds = 0;
};

struct Placement {
  Tier weights = Tier::kDevice;      // home of the low-precision weights
  Tier states = Tier::kHost;         // fp32 master weights + optimizer states
  Tier activations = Tier::kDevice;  // where saved activations (block inputs) wait for backward
  int prefetch_depth = 1;            // chunks fetched ahead when weights stream
  // States in RAM: a second copy of them, so that chunks are updated as
  // they land (TrainerOptions::speculate_in_ram).
  bool speculate_in_ram = false;
  // With gradient accumulation: the vertical order when > 1 — this many
  // micro-batches of a block at once (a divisor of grad_accum; their
  // activations on any tier), chosen by the planner where it is faster and
  // fits, or asked for (TrainSetup::micro_batches_per_pass).
  int64_t micro_batches_per_pass = 1;
  // Where the gradients wait for the optimizer: the host (one buffer per
  // chunk), or NVMe — a ring of TrainSetup::gradient_buffers chunk buffers
  // on the host, each gradient (or fp32 sum) written to NVMe as it lands and
  // read back for an update after the verdict (TrainerOptions::gradients;
  // where it runs: gradients_run_on_nvme).
  Tier gradients = Tier::kHost;
  bool operator==(const Placement&) const = default;
};

struct Plan {
  TrainSetup setup;
  Placement placement;
  int device_chunk_buffers = 0;  // weight buffers on the device (0 when weights are resident)
  TierBytes device, host, nvme;
  std::vector<LinkTime> links;
  // The step: the slowest overlapped link, plus what an exact step cannot
  // overlap (estimate() says which).
  double step_seconds = 0;
  double overlapped_seconds = 0;  // the slowest link that runs beside the compute
  double head_seconds = 0;        // before the first block can compute
  double tail_seconds = 0;        // after the last gradient lands
  int64_t parameters = 0;
  std::string why;               // one line on the choice
  Bandwidths bandwidths;         // the rates the times were divided by
};

// Tiers the user fixed (a DeepSpeed config's offload_param / offload_optimizer
// device, say); unset ones are the planner's choice.
struct Constraints {
  std::optional<Tier> weights;
  std::optional<Tier> states;
  std::optional<Tier> activations;
  std::optional<Tier> gradients;
  // false: never a second copy of the states in RAM (Placement::
  // speculate_in_ram) — a run whose optimizer memory is counted elsewhere.
  bool allow_speculate_in_ram = true;
};

// The bytes and link times of one placement, whether or not it fits.
// setup.model is set and accepts setup.micro_batch, and the chunks' types
// are none or one per chunk (make_plan checks all three).
Plan estimate(const TrainSetup& setup, const Placement& placement, const Bandwidths& bw);
// Whether every tier of the plan is within its budget.
bool fits(const Plan& plan, const Budgets& budgets);

// The fastest placement that fits the budgets. When none fits,
// ResourceExhausted says which budget is short by how much for the closest
// placement, and the largest micro-batch that would fit (if any).
// InvalidArgument without a model, or for a micro-batch it refuses.
Result<Plan> make_plan(const TrainSetup& setup, const Budgets& budgets, const Bandwidths& bw,
                       const Constraints& constraints = {});

// A printable table: placement, bytes per tier and kind, time per link.
std::string format_plan(const Plan& plan, const Budgets& budgets);

}  // namespace strata::engine
