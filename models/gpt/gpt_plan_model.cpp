#include "models/gpt/gpt_plan_model.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gpu/device_factory.h"
#include "models/gpt/gpt_calibrate.h"
#include "models/gpt/gpt_ops_factory.h"

namespace strata::engine {
namespace {

class GptPlanModel final : public PlanModel {
 public:
  GptPlanModel(const gpt::GptConfig& config, int64_t seq) : config_(config), seq_(seq) {
    if (!config.validate().ok()) return;  // check() says why
    parameters_ = gpt::parameter_count(config);
    // Every chunk's element count in model order (embedding, blocks,
    // final), as gpt::model_layout pads them, without building the
    // tensors' names.
    const gpt::EndOffsets ends = gpt::end_offsets(config);
    chunks_.assign(static_cast<size_t>(config.layers) + 2, ends.block_numel);
    chunks_.front() = gpt::embedding_layout(config).numel;
    chunks_.back() = ends.final_numel;
  }

  const std::vector<int64_t>& chunk_elems() const override { return chunks_; }
  int64_t parameters() const override { return parameters_; }

  Status check(int64_t micro_batch) const override {
    STRATA_RETURN_IF_ERROR(config_.validate());
    if (micro_batch < 1 || seq_ < 1 || seq_ > config_.max_seq) {
      return invalid_argument("training setup: micro_batch >= 1 and 1 <= seq <= max_seq (" +
                              std::to_string(config_.max_seq) + ") required");
    }
    return ok_status();
  }

  std::string micro_batch_text(int64_t micro_batch) const override {
    return "micro-batch " + std::to_string(micro_batch) + " x " + std::to_string(seq_) + " tokens";
  }

  // The embedding's output and every block's: L + 1 block inputs, of
  // which the last gpt::kOffloadedInputBuffers never leave the device.
  ModelActivations activations(int64_t micro_batch, DType compute) const override {
    ModelActivations c;
    c.count = config_.layers + 1;
    c.saved = std::max<int64_t>(c.count - gpt::kOffloadedInputBuffers, 0);
    c.bytes = static_cast<uint64_t>(micro_batch * seq_ * config_.hidden) * dtype_bytes(compute);
    return c;
  }

  // The ops' workspace (gpt::gpt_ops_workspace: one block's working set
  // and the head's) and SessionGpt's step buffers (gpt::gpt_step_buffers).
  ModelDeviceBytes device_bytes(const ModelPass& p) const override {
    const gpt::WorkspaceBytes ws = gpt::gpt_ops_workspace(p.host_backend ? gpu::Backend::kHost : gpu::Backend::kCuda,
                                                            config_, p.compute, p.micro_batch, seq_);
    const gpt::GptStepBuffers step =
        gpt::gpt_step_buffers(config_, static_cast<int64_t>(dtype_bytes(p.compute)), p.micro_batch, seq_, p.pass,
                              p.grad_accum, p.offload_activations);
    // SessionGpt allocates each of its step buffers once, charged in the
    // device's allocation units.
    ModelDeviceBytes b;
    b.working_set = ws.activations;
    b.activations_kept = gpu::device_allocation_bytes(step.block_inputs);
    b.step = ws.total - ws.activations + gpu::device_allocation_bytes(step.step);
    b.resident = step.embedding_gradients > 0 ? gpu::device_allocation_bytes(step.embedding_gradients) : 0;
    return b;
  }

  double flops(int64_t micro_batch) const override {
    return gpt::training_flops_per_token(config_, seq_, /*recompute=*/true) * static_cast<double>(micro_batch * seq_);
  }

  // One block of the model's width (a width above 2048 at 2048, where
  // GEMMs are long since at their peak) through the device's own ops.
  Result<double> measure_flops(gpu::Device& device, DType compute, int64_t micro_batch, double seconds) const override {
    gpt::GptConfig block = config_;
    block.hidden = std::min<int64_t>(block.hidden, 2048);
    block.heads = std::max<int64_t>(1, std::min(block.heads, block.hidden / 64));
    if (block.hidden % block.heads != 0) block.heads = 1;
    block.layers = 1;
    return gpt::measure_block_flops(device, block, compute, micro_batch, seq_, seconds);
  }

 private:
  gpt::GptConfig config_;
  int64_t seq_;
  int64_t parameters_ = 0;
  std::vector<int64_t> chunks_;
};

}  // namespace

std::shared_ptr<const PlanModel> gpt_plan_model(const gpt::GptConfig& config, int64_t seq) {
  return std::make_shared<GptPlanModel>(config, seq);
}

}  // namespace strata::engine
