// Trainer: the built-in GPT's training loop as a client of the engine's
// session. The session (engine/session.h) owns every byte of model state
// and the optimizer; SessionGpt (session_gpt.h) computes the GPT through
// the session's calls; the trainer translates its options, keeps the data
// stream's position, follows the session's verdicts into its counters and
// writes its own checkpoint record (trainer_checkpoint.cpp).
#include "models/gpt/trainer.h"

#include <chrono>
#include <utility>


namespace strata::engine {
namespace {

SessionGptOptions gpt_options_of(const TrainerOptions& o) {
  SessionGptOptions g;
  g.model = o.model;
  g.batch = o.batch;
  g.seq = o.seq;
  g.seed = o.seed;
  g.offload_activations = o.activations != Tier::kDevice;
  g.micro_batches_per_pass = micro_batches_per_pass(o);
  g.stop = o.stop;
  return g;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainerOptions& o) {
  STRATA_RETURN_IF_ERROR(check_options(o));
  STRATA_RETURN_IF_ERROR(check_budgets(o));
  std::unique_ptr<Trainer> tr(new Trainer());
  tr->options_ = o;
  STRATA_ASSIGN_OR_RETURN(tr->session_, Session::create(session_options_of(o)));
  STRATA_ASSIGN_OR_RETURN(tr->gpt_, SessionGpt::create(*tr->session_, gpt_options_of(o)));
  if (!o.initial_state) {
    tr->unset_ = true;  // the first load places the chunks, without initial values
    return tr;
  }
  // The session holds its host memory to budgets.host, before allocating
  // and exactly after (the GPT on it keeps none of its own).
  STRATA_RETURN_IF_ERROR(tr->session_->start());
  return tr;
}

Trainer::~Trainer() {
  gpt_.reset();  // its device memory goes back before the session's device
  session_.reset();
}

uint64_t Trainer::host_bytes() const {
  return session_->host_bytes();
}

void Trainer::report(std::string_view what, int64_t done, int64_t total) const {
  if (options_.progress) options_.progress(what, done, total);
}

Status Trainer::read_master(size_t chunk, float* dst) {
  if (chunk >= layout().size()) {
    return invalid_argument("trainer: read_master: chunk " + std::to_string(chunk) + " of " +
                            std::to_string(layout().size()));
  }
  return session_->read_master(chunk, std::span(dst, static_cast<size_t>(layout()[chunk].numel)))
      .with_context("trainer: read_master");
}

Status Trainer::finalize() {
  return session_->finalize().with_context("trainer: finalize");
}

Status Trainer::async_error() {
  return session_->async_error();
}

Result<float> Trainer::step() {
  return run_step(nullptr, nullptr);
}

Result<float> Trainer::step(std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  const int64_t V = options_.model.vocab;
  const auto n = static_cast<size_t>(options_.grad_accum * options_.batch * options_.seq);
  if (tokens.size() != n || targets.size() != n) {
    return invalid_argument("trainer step: expected " + std::to_string(n) + " tokens and as many targets (" +
                            std::to_string(options_.grad_accum) + " micro-batches x " + std::to_string(options_.batch) +
                            " sequences x " + std::to_string(options_.seq) + " tokens), got " +
                            std::to_string(tokens.size()) + " and " + std::to_string(targets.size()));
  }
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V || targets[i] < 0 || targets[i] >= V) {
      const bool tok = tokens[i] < 0 || tokens[i] >= V;
      return invalid_argument("trainer step: " + std::string(tok ? "token " : "target ") + std::to_string(i) + " is " +
                              std::to_string(tok ? tokens[i] : targets[i]) + ", outside the vocabulary 0.." +
                              std::to_string(V - 1));
    }
  }
  return run_step(tokens.data(), targets.data());
}

// One step through the GPT on the session: the synthetic stream's next
// micro-batches (indexed by the step count, so a failed step's retry reads
// them again) or the caller's; then the verdict into the trainer's view.
Result<float> Trainer::run_step(const int32_t* tokens, const int32_t* targets) {
  if (unset_) {
    return failed_precondition(
        "trainer: created without initial weights and states (TrainerOptions::initial_state false); load a "
        "checkpoint to continue");
  }
  Trace* trace = options_.trace;
  const double t0_us = trace ? trace->now_us() : 0;
  const std::string step_name = trace ? "step " + std::to_string(steps_done() + 1) + ": " : std::string();
  const SessionCounters before = session_->counters();
  const auto t0 = std::chrono::steady_clock::now();
  const auto n = static_cast<size_t>(options_.grad_accum * options_.batch * options_.seq);
  Result<float> loss = tokens == nullptr ? gpt_->step() : gpt_->step({tokens, n}, {targets, n});
  if (!loss) return loss;
  const double total = seconds_since(t0);
  last_times_.optimizer = gpt_->last_update_wait_seconds();
  last_times_.forward_backward = total - last_times_.optimizer;
  rollbacks_ += gpt_->last_verdict().rolled_back ? 1 : 0;
  const SessionCounters after = session_->counters();
  StepCounters k;
  k.h2d_bytes = after.h2d_bytes - before.h2d_bytes;
  k.d2h_bytes = after.d2h_bytes - before.d2h_bytes;
  k.nvme_read_bytes = after.nvme_read_bytes - before.nvme_read_bytes;
  k.nvme_written_bytes = after.nvme_written_bytes - before.nvme_written_bytes;
  k.device_wait_s = after.device_wait_s - before.device_wait_s;
  k.device_idle_fraction = last_times_.forward_backward > 0 ? k.device_wait_s / last_times_.forward_backward : 0.0;
  last_counters_ = k;
  if (trace) {
    const double split = t0_us + last_times_.forward_backward * 1e6;
    trace->span("trainer", step_name + "forward+backward", t0_us, split, "phase");
    trace->span(
        "trainer",
        step_name + (options_.delayed_update ? "optimizer stage (previous step's)" : "optimizer stage and weights"),
        split, trace->now_us(), "phase");
  }
  return loss;
}

}  // namespace strata::engine
