#include "models/gpt/session_gpt.h"

#include <chrono>
#include <string>
#include <utility>

#include "common/dtype.h"
#include "models/gpt/gpt_init.h"
#include "models/gpt/gpt_ops_factory.h"

namespace strata::engine {

Result<std::unique_ptr<SessionGpt>> SessionGpt::create(Session& session, const SessionGptOptions& o) {
  STRATA_RETURN_IF_ERROR(o.model.validate());
  if (o.batch < 1 || o.seq < 1 || o.seq > o.model.max_seq) {
    return invalid_argument("session GPT: batch must be >= 1 and seq 1.." + std::to_string(o.model.max_seq));
  }
  if (session.started() || session.chunks() > 0) {
    return failed_precondition("session GPT: needs a session with no chunks registered (not started)");
  }
  if (!session.options().resident_first) {
    return invalid_argument(
        "session GPT: the session must keep its first chunk resident (resident_first: the "
        "embeddings are used at both ends of a step)");
  }
  const int64_t A = session.options().grad_accum;
  const int64_t V = o.micro_batches_per_pass == 0 ? A : o.micro_batches_per_pass;
  if (V < 1 || A % V != 0) {
    return invalid_argument("session GPT: micro_batches_per_pass must divide the session's grad_accum (" +
                            std::to_string(A) + "), got " + std::to_string(o.micro_batches_per_pass));
  }
  if (o.offload_activations && o.model.layers < 2) {
    return invalid_argument("session GPT: offloading block inputs needs at least 2 layers");
  }
  std::unique_ptr<SessionGpt> m(new SessionGpt());
  m->session_ = &session;
  m->options_ = o;
  m->layout_ = gpt::model_layout(o.model);
  m->es_ = dtype_bytes(session.precision());
  m->pass_ = V;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<cpu_optim::Executor> executor, cpu_optim::Executor::create());
  // The initialisers own what they use: a start that fails keeps them in
  // the session for the next, after this object is gone.
  std::shared_ptr<cpu_optim::Executor> ex = std::move(executor);
  for (size_t c = 0; c < m->layout_.size(); ++c) {
    const gpt::ChunkLayout* chunk = &m->layout_[c];
    const uint64_t seed = o.seed;
    const int64_t layers = o.model.layers;
    auto init = [layout = *chunk, c, seed, layers, ex](std::span<float> dst) -> Status {
      initial_master(layout, c, seed, layers, *ex, dst.data());
      return ok_status();
    };
    STRATA_ASSIGN_OR_RETURN(const size_t index, session.add_chunk(chunk_name(*chunk), chunk->numel, init));
    // Its checkpoints hold GPT-2's tensors, by their names.
    for (const gpt::TensorSlot& t : chunk->tensors) {
      STRATA_RETURN_IF_ERROR(session.add_tensor(index, {t.name, t.offset, t.shape}));
    }
  }
  // The session starts at the first step — or a load before it places the
  // chunks without drawing the initial weights at all (a resume).
  STRATA_RETURN_IF_ERROR(m->allocate());
  return m;
}

SessionGpt::~SessionGpt() {
  if (session_ != nullptr && compute_.id >= 0) session_->device().synchronize(compute_).ignore();
}

// The model's device memory, from the session's budget: the ops'
// workspace and the step's buffers, as gpt::gpt_step_buffers counts them
// (the planner counts them there too).
Status SessionGpt::allocate() {
  gpu::Device& dev = session_->device();
  const int64_t N = options_.batch * options_.seq, V = pass_;
  STRATA_ASSIGN_OR_RETURN(ops_, gpt::make_gpt_ops(dev, options_.model, session_->precision()));
  STRATA_ASSIGN_OR_RETURN(compute_, dev.create_stream("model compute"));
  STRATA_ASSIGN_OR_RETURN(workspace_, ops_->workspace(options_.batch, options_.seq));
  const gpt::GptStepBuffers b =
      gpt::gpt_step_buffers(options_.model, static_cast<int64_t>(es_), options_.batch, options_.seq, V,
                            session_->options().grad_accum, options_.offload_activations);
  STRATA_ASSIGN_OR_RETURN(inputs_, session_->allocate_device(b.block_inputs, "block inputs"));
  STRATA_ASSIGN_OR_RETURN(step_mem_, session_->allocate_device(b.step, "block gradients, losses and tokens"));
  loss_ = reinterpret_cast<float*>(step_mem_.as<uint8_t>() + static_cast<uint64_t>(2 * V) * b.input);
  tokens_ = reinterpret_cast<int32_t*>(loss_ + session_->options().grad_accum);
  targets_ = tokens_ + V * N;
  if (b.embedding_gradients > 0) {
    STRATA_ASSIGN_OR_RETURN(emb_grads_,
                            session_->allocate_device(b.embedding_gradients, "embedding gradients of a pass"));
  }
  return ok_status();
}

uint64_t SessionGpt::input_bytes() const {
  return static_cast<uint64_t>(options_.batch * options_.seq * options_.model.hidden) * es_;
}

uint64_t SessionGpt::chunk_bytes(size_t chunk) const {
  return static_cast<uint64_t>(layout_[chunk].numel) * es_;
}

// Block input l of a pass: its micro-batches' side by side (one save, one
// load when offloaded).
uint8_t* SessionGpt::input(int64_t m, int64_t l) const {
  const int64_t slot = options_.offload_activations ? l % gpt::kOffloadedInputBuffers : l;
  return inputs_.as<uint8_t>() + static_cast<uint64_t>(slot * pass_ + m) * input_bytes();
}

// Offloaded, block input l shares its device buffers with l + 2 (there
// are gpt::kOffloadedInputBuffers): each is handed to the session once
// written, except the last two (L - 1 and L), which forward leaves on the
// device for the head and the last block.
// The save is stream-ordered: its copy follows the block that wrote the
// input, beside the next block's compute; the block that writes over its
// buffers (l + 2) waits for it (input_saved).
Status SessionGpt::save_input(int64_t l) {
  if (!options_.offload_activations || l >= options_.model.layers - 1) return ok_status();
  return session_->save_activation(static_cast<uint64_t>(l), input(0, l), static_cast<uint64_t>(pass_) * input_bytes(),
                                   compute_);
}

// Before block l's forward writes input l into the buffers of input l - 2:
// the model's stream waits for that input's save.
Status SessionGpt::input_saved(int64_t l) {
  if (!options_.offload_activations || l < 2) return ok_status();
  return session_->activation_saved(static_cast<uint64_t>(l - 2), compute_);
}

// Block input l's load started while the block above computes (it goes
// into the buffers of input l + 2, used by then); load_input waits for it.
// Both stream-ordered: the copy into the buffers waits, on the device, for
// the blocks queued before it that read them.
Status SessionGpt::prefetch_input(int64_t l) {
  if (!options_.offload_activations || l < 0 || l >= options_.model.layers - 1) return ok_status();
  return session_->prefetch_activation(static_cast<uint64_t>(l), input(0, l),
                                       static_cast<uint64_t>(pass_) * input_bytes(), compute_);
}

Status SessionGpt::load_input(int64_t l) {
  if (!options_.offload_activations || l >= options_.model.layers - 1) return ok_status();
  return session_->load_activation(static_cast<uint64_t>(l), input(0, l), static_cast<uint64_t>(pass_) * input_bytes(),
                                   compute_);
}

Status SessionGpt::run(const std::function<Status()>& enqueue, const char* what, int64_t block) {
  gpu::Device& dev = session_->device();
  Trace* trace = session_->options().trace;
  const bool traced = what != nullptr && trace != nullptr && trace->enabled();
  const double t0 = traced ? trace->now_us() : 0;
  Status queued = enqueue();
  // Untraced, the compute stays queued: the session's stream-ordered calls
  // order the copies around it. A span needs its end.
  Status done = traced || what == nullptr ? dev.synchronize(compute_) : ok_status();
  if (traced) {
    trace->span("compute", block < 0 ? std::string(what) : std::string(what) + " block " + std::to_string(block), t0,
                trace->now_us(), "compute");
  }
  STRATA_RETURN_IF_ERROR(queued);
  return done;
}

// Before a block: the embeddings' gradient, the step's last, is not in
// yet, so the session can still cancel the step.
Status SessionGpt::check_stop(const char* pass, int64_t block) const {
  if (!options_.stop || !options_.stop()) return ok_status();
  return cancelled("step " + std::to_string(session_->steps_done() + 1) + " cancelled before the " + pass +
                   " of block " + std::to_string(block) + ": a stop was asked for");
}

Result<float> SessionGpt::step() {
  const int64_t A = session_->options().grad_accum;
  std::vector<int32_t> tokens, targets, tk, tg;
  for (int64_t k = 0; k < A; ++k) {
    synthetic_batch(options_.seed, options_.model.vocab, options_.batch, options_.seq, session_->steps_done() * A + k,
                    &tk, &tg);
    tokens.insert(tokens.end(), tk.begin(), tk.end());
    targets.insert(targets.end(), tg.begin(), tg.end());
  }
  return step(tokens, targets);
}

Result<float> SessionGpt::step(std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  const int64_t A = session_->options().grad_accum, V = options_.model.vocab;
  const auto n = static_cast<size_t>(A * options_.batch * options_.seq);
  if (tokens.size() != n || targets.size() != n) {
    return invalid_argument("session GPT step: expected " + std::to_string(n) + " tokens and as many targets, got " +
                            std::to_string(tokens.size()) + " and " + std::to_string(targets.size()));
  }
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V || targets[i] < 0 || targets[i] >= V) {
      return invalid_argument("session GPT step: token or target " + std::to_string(i) +
                              " is outside the vocabulary 0.." + std::to_string(V - 1));
    }
  }
  STRATA_RETURN_IF_ERROR(session_->begin_step(1.0f / static_cast<float>(A)));
  double sum = 0;
  Status s = run_step(tokens.data(), targets.data(), &sum);
  if (!s.ok()) {
    session_->device().synchronize(compute_).ignore();  // nothing queued reads what the step gives back
    session_->cancel_step().ignore();
    return s;
  }
  const auto t0 = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(verdict_, session_->end_step());
  update_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The trainer's mean: the losses summed in double, in micro-batch order.
  return A == 1 ? static_cast<float>(sum) : static_cast<float>(sum / static_cast<double>(A));
}

Status SessionGpt::run_step(const int32_t* tokens, const int32_t* targets, double* loss_sum) {
  const int64_t A = session_->options().grad_accum, n = options_.batch * options_.seq;
  for (int64_t k0 = 0; k0 < A; k0 += pass_) STRATA_RETURN_IF_ERROR(pass(tokens + k0 * n, targets + k0 * n, k0));
  std::vector<float> losses(static_cast<size_t>(A));
  gpu::Device& dev = session_->device();
  STRATA_RETURN_IF_ERROR(
      run([&] { return dev.copy_to_host(compute_, losses.data(), loss_, static_cast<uint64_t>(A) * 4); }));
  for (float l : losses) *loss_sum += l;
  return ok_status();
}

// Micro-batches k0 .. k0 + pass_ - 1 of the step, each block's weights
// acquired once for all of them.
Status SessionGpt::pass(const int32_t* tokens, const int32_t* targets, int64_t k0) {
  gpu::Device& dev = session_->device();
  const uint64_t token_bytes = static_cast<uint64_t>(pass_ * options_.batch * options_.seq) * 4;
  auto copy_up = [&]() -> Status {
    STRATA_RETURN_IF_ERROR(dev.copy_to_device(compute_, tokens_, tokens, token_bytes));
    return dev.copy_to_device(compute_, targets_, targets, token_bytes);
  };
  STRATA_RETURN_IF_ERROR(run(copy_up));
  dx_.clear();
  dx_in_.clear();
  for (int64_t m = 0; m < pass_; ++m) {  // dx and dx_in side by side: zeroed as one; swapped block by block
    dx_.push_back(step_mem_.as<uint8_t>() + static_cast<uint64_t>(2 * m) * input_bytes());
    dx_in_.push_back(dx_.back() + input_bytes());
  }
  STRATA_ASSIGN_OR_RETURN(const void* emb, session_->acquire(0, compute_));
  STRATA_RETURN_IF_ERROR(forward(emb));
  // The embeddings' gradient is complete only after the embedding's
  // backward: the first micro-batch's in the session's buffer, the others'
  // in the model's own until their turn.
  std::vector<void*> emb_grad;
  STRATA_ASSIGN_OR_RETURN(void* first, session_->gradient_buffer(0));
  emb_grad.push_back(first);
  for (int64_t m = 1; m < pass_; ++m) emb_grad.push_back(emb_grads_.as<uint8_t>() + (m - 1) * chunk_bytes(0));
  STRATA_RETURN_IF_ERROR(head_backward(emb, emb_grad, k0));
  for (int64_t l = options_.model.layers; l >= 1; --l) {
    STRATA_RETURN_IF_ERROR(check_stop("backward", l));
    STRATA_RETURN_IF_ERROR(backward_block(l));
  }
  STRATA_RETURN_IF_ERROR(embedding_backward(emb_grad));
  return session_->release(0, compute_);
}

// The embedding, then every block, keeping each block's inputs.
Status SessionGpt::forward(const void* emb) {
  const int64_t N = options_.batch * options_.seq;
  auto embed = [&]() -> Status {
    for (int64_t m = 0; m < pass_; ++m) {
      STRATA_RETURN_IF_ERROR(ops_->embedding_forward(compute_, *workspace_, emb, tokens_ + m * N, input(m, 0)));
    }
    return ok_status();
  };
  STRATA_RETURN_IF_ERROR(run(embed, "embedding forward"));
  STRATA_RETURN_IF_ERROR(save_input(0));
  for (int64_t l = 1; l <= options_.model.layers; ++l) {
    STRATA_RETURN_IF_ERROR(check_stop("forward", l));
    const auto c = static_cast<size_t>(l);
    STRATA_ASSIGN_OR_RETURN(const void* w, session_->acquire(c, compute_));
    STRATA_RETURN_IF_ERROR(input_saved(l));
    auto block = [&]() -> Status {
      for (int64_t m = 0; m < pass_; ++m) {
        STRATA_RETURN_IF_ERROR(ops_->block_forward(compute_, *workspace_, w, input(m, l - 1), input(m, l)));
      }
      return ok_status();
    };
    STRATA_RETURN_IF_ERROR(run(block, "forward", l));
    STRATA_RETURN_IF_ERROR(session_->release(c, compute_));
    STRATA_RETURN_IF_ERROR(save_input(l));
  }
  return ok_status();
}

// Per micro-batch, the head's forward (it leaves in the workspace what its
// backward reads) and backward, which starts the embeddings' gradient.
Status SessionGpt::head_backward(const void* emb, const std::vector<void*>& emb_grad, int64_t k0) {
  const int64_t N = options_.batch * options_.seq, L = options_.model.layers;
  const auto final_chunk = static_cast<size_t>(L + 1);
  const float dloss = static_cast<float>(session_->loss_scale());
  STRATA_ASSIGN_OR_RETURN(const void* wf, session_->acquire(final_chunk, compute_));
  for (int64_t m = 0; m < pass_; ++m) {
    const auto u = static_cast<size_t>(m);
    STRATA_RETURN_IF_ERROR(run(
        [&] {
          return ops_->head_forward(compute_, *workspace_, wf, emb, input(m, L), targets_ + m * N, loss_ + k0 + m);
        },
        "head forward"));
    STRATA_ASSIGN_OR_RETURN(void* df, session_->gradient_buffer(final_chunk));
    auto head = [&]() -> Status {
      STRATA_RETURN_IF_ERROR(ops_->zero(compute_, df, chunk_bytes(final_chunk)));
      STRATA_RETURN_IF_ERROR(ops_->zero(compute_, emb_grad[u], chunk_bytes(0)));
      STRATA_RETURN_IF_ERROR(ops_->zero(compute_, dx_[u], 2 * input_bytes()));  // dx, dx_in
      return ops_->head_backward(compute_, *workspace_, wf, df, emb, emb_grad[u], input(m, L), targets_ + m * N, dloss,
                                 dx_[u]);
    };
    STRATA_RETURN_IF_ERROR(run(head, "head backward"));
    STRATA_RETURN_IF_ERROR(session_->submit_gradient(final_chunk, compute_));
  }
  return session_->release(final_chunk, compute_);
}

// Block l's inputs back when offloaded; per micro-batch its forward
// recomputed from its input (the output discarded into dx_in), its
// backward, its gradient submitted.
Status SessionGpt::backward_block(int64_t l) {
  const auto c = static_cast<size_t>(l);
  const uint64_t x_bytes = input_bytes();
  STRATA_RETURN_IF_ERROR(load_input(l - 1));
  STRATA_RETURN_IF_ERROR(prefetch_input(l - 2));
  STRATA_ASSIGN_OR_RETURN(const void* w, session_->acquire(c, compute_));
  for (int64_t m = 0; m < pass_; ++m) {
    const auto u = static_cast<size_t>(m);
    auto recompute = [&]() -> Status {
      STRATA_RETURN_IF_ERROR(ops_->block_forward(compute_, *workspace_, w, input(m, l - 1), dx_in_[u]));
      return ops_->zero(compute_, dx_in_[u], x_bytes);
    };
    STRATA_RETURN_IF_ERROR(run(recompute, "recompute+backward", l));
    STRATA_ASSIGN_OR_RETURN(void* dw, session_->gradient_buffer(c));
    auto block = [&]() -> Status {
      STRATA_RETURN_IF_ERROR(ops_->zero(compute_, dw, chunk_bytes(c)));
      return ops_->block_backward(compute_, *workspace_, w, dw, input(m, l - 1), dx_[u], dx_in_[u]);
    };
    STRATA_RETURN_IF_ERROR(run(block, "recompute+backward", l));
    STRATA_RETURN_IF_ERROR(session_->submit_gradient(c, compute_));
    std::swap(dx_[u], dx_in_[u]);
  }
  return session_->release(c, compute_);
}

// The embedding's backward completes chunk 0's gradient, micro-batch by
// micro-batch; a later one's is copied into the session's buffer once the
// one before has left it.
Status SessionGpt::embedding_backward(const std::vector<void*>& emb_grad) {
  const int64_t N = options_.batch * options_.seq;
  gpu::Device& dev = session_->device();
  for (int64_t m = 0; m < pass_; ++m) {
    const auto u = static_cast<size_t>(m);
    void* into = emb_grad[0];
    if (m > 0) {
      STRATA_ASSIGN_OR_RETURN(into, session_->gradient_buffer(0));
    }
    auto embedding = [&]() -> Status {
      STRATA_RETURN_IF_ERROR(ops_->embedding_backward(compute_, *workspace_, emb_grad[u], tokens_ + m * N, dx_[u]));
      return m > 0 ? dev.copy_on_device(compute_, into, emb_grad[u], chunk_bytes(0)) : ok_status();
    };
    STRATA_RETURN_IF_ERROR(run(embedding, "embedding backward"));
    STRATA_RETURN_IF_ERROR(session_->submit_gradient(0, compute_));
  }
  return ok_status();
}

}  // namespace strata::engine
