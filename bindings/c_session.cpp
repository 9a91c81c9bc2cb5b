// The C API's session calls (strata.h, "The session") over engine::Session:
// a config's text to session options (engine/session_config.h), chunks
// registered from C arrays or callbacks, the step's calls one for one, and
// the model's device memory from the session's budget. Every entry point
// turns a Status or an exception into a strata_status and this thread's
// last error; nothing throws across the C boundary.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bindings/c_status.h"
#include "bindings/include/strata/strata.h"
#include "common/dtype.h"
#include "engine/config.h"
#include "engine/session.h"
#include "engine/session_config.h"
#include "engine/session_plan.h"

struct strata_session {
  std::unique_ptr<strata::engine::Session> session;
  std::vector<std::string> warnings;                         // unknown keys; choices a session does not honour
  std::map<void*, strata::gpu::DeviceMemory> device_memory;  // strata_session_device_alloc's, by address
  std::string description;  // strata_session_describe's last answer
};

namespace {

using strata::Result;
using strata::Status;
using strata::bindings::guarded;
using strata::bindings::report;
namespace engine = strata::engine;

Status usable(const strata_session* s, const char* call) {
  if (s == nullptr) return strata::invalid_argument(std::string(call) + ": session is NULL");
  return strata::ok_status();
}

// A chunk index from C, checked against the session.
Result<size_t> chunk_of(const strata_session* s, const char* call, int64_t chunk) {
  if (chunk < 0 || static_cast<uint64_t>(chunk) >= s->session->chunks()) {
    return strata::invalid_argument(std::string(call) + ": no chunk " + std::to_string(chunk) + " (" +
                                    std::to_string(s->session->chunks()) + " registered)");
  }
  return static_cast<size_t>(chunk);
}

// The stream arguments: a CUDA stream is not taken yet.
// The caller's native stream (a cudaStream_t) as a stream of the session's
// device; none for NULL (the call waits on the host instead).
Result<strata::gpu::Stream> stream_of(strata_session* s, void* stream) {
  if (stream == nullptr) return strata::gpu::Stream{};
  return s->session->device().adopt_stream(stream);
}

Result<strata::gpu::Backend> backend_of(const char* call, const char* device) {
  const std::string dev = device == nullptr ? "host" : device;
  if (dev == "host") return strata::gpu::Backend::kHost;
  if (dev == "cuda") return strata::gpu::Backend::kCuda;
  return strata::invalid_argument(std::string(call) + ": device \"" + dev + "\" is not one of host, cuda");
}

// A session's config from C: the parsed config and the session's options
// on `device`; the warnings into *warnings.
struct SessionConfig {
  engine::EngineConfig config;
  engine::SessionOptions options;
};
Result<SessionConfig> session_config(const char* call, const char* config_json, const char* device,
                                     std::vector<std::string>* warnings) {
  STRATA_ASSIGN_OR_RETURN(const nlohmann::json j, strata::bindings::parse_config_text(call, config_json));
  SessionConfig c;
  STRATA_ASSIGN_OR_RETURN(c.config, engine::parse_config(j, warnings));
  STRATA_ASSIGN_OR_RETURN(c.options, engine::session_options(c.config, warnings));
  STRATA_ASSIGN_OR_RETURN(c.options.backend, backend_of(call, device));
  return c;
}

// A working type's name from C ("bf16", "fp16", "fp32").
Result<strata::DType> dtype_of(const std::string& call, const char* name) {
  const std::string n = name == nullptr ? "NULL" : name;
  if (const std::optional<strata::DType> t = strata::dtype_from_name(n); t && name != nullptr) return *t;
  return strata::invalid_argument(call + ": \"" + n + "\" is not a working type (bf16, fp16, fp32)");
}

Status add_chunk(strata_session* s, const char* call, const char* name, int64_t count, engine::ChunkInit init,
                 int64_t* chunk) {
  STRATA_RETURN_IF_ERROR(usable(s, call));
  if (name == nullptr) return strata::invalid_argument(std::string(call) + ": name is NULL");
  STRATA_ASSIGN_OR_RETURN(size_t c, s->session->add_chunk(name, count, std::move(init)));
  if (chunk != nullptr) *chunk = static_cast<int64_t>(c);
  return strata::ok_status();
}

// A C description of a model (strata_model_plan) as the planner reads it.
class CPlanModel final : public engine::PlanModel {
 public:
  // `dtypes`: the model's chunk_dtypes, parsed (check_model_plan).
  CPlanModel(const strata_model_plan& m, std::vector<strata::DType> dtypes)
      : m_(m), chunks_(m.chunk_counts, m.chunk_counts + m.chunk_count), dtypes_(std::move(dtypes)) {
    for (int64_t c : chunks_) parameters_ += c;
  }
  const std::vector<int64_t>& chunk_elems() const override { return chunks_; }
  std::vector<strata::DType> chunk_dtypes() const override { return dtypes_; }
  int64_t parameters() const override { return parameters_; }
  bool resident_first() const override { return m_.resident_first != 0; }
  Status check(int64_t micro_batch) const override {
    if (micro_batch == m_.micro_batch) return strata::ok_status();
    return strata::invalid_argument("the model is described for micro-batches of " + std::to_string(m_.micro_batch));
  }
  engine::ModelActivations activations(int64_t, strata::DType) const override {
    return {m_.activations, m_.activations_saved, m_.activation_bytes};
  }
  engine::ModelDeviceBytes device_bytes(const engine::ModelPass& p) const override {
    engine::ModelDeviceBytes b;
    const int64_t kept = p.offload_activations ? m_.activations_in_flight : m_.activations;
    b.activations_kept = static_cast<uint64_t>(kept * p.pass) * m_.activation_bytes;
    b.step = m_.device_bytes;
    return b;
  }
  double flops(int64_t) const override { return m_.flops; }

 private:
  strata_model_plan m_;
  std::vector<int64_t> chunks_;
  std::vector<strata::DType> dtypes_;
  int64_t parameters_ = 0;
};

// The model's description checked, with its chunks' types parsed (empty:
// every chunk in the precision).
Result<std::vector<strata::DType>> check_model_plan(const strata_model_plan* m) {
  const char* call = "strata_session_plan";
  auto bad = [&](const std::string& why) { return strata::invalid_argument(std::string(call) + ": " + why); };
  if (m == nullptr) return bad("model is NULL");
  if (m->chunk_counts == nullptr || m->chunk_count == 0) return bad("the model has no chunks");
  for (size_t c = 0; c < m->chunk_count; ++c) {
    if (m->chunk_counts[c] < 1) return bad("chunk " + std::to_string(c) + " has no elements");
  }
  if (m->micro_batch < 1) return bad("micro_batch must be at least 1");
  if (m->activations < 0 || m->activations_saved < 0 || m->activations_saved > m->activations ||
      m->activations_in_flight < 0) {
    return bad("activations: 0 <= activations_saved <= activations and activations_in_flight >= 0");
  }
  if (!(m->flops >= 0)) return bad("flops must be >= 0");
  std::vector<strata::DType> dtypes;
  for (size_t c = 0; m->chunk_dtypes != nullptr && c < m->chunk_count; ++c) {
    STRATA_ASSIGN_OR_RETURN(strata::DType t,
                            dtype_of(std::string(call) + ": chunk " + std::to_string(c), m->chunk_dtypes[c]));
    dtypes.push_back(t);
  }
  return dtypes;
}

// The plan as the keys of a session's config, its bytes and its text.
std::string plan_json(const engine::Plan& plan, const engine::Budgets& budgets) {
  const engine::Placement& pl = plan.placement;
  auto tier = [](engine::Tier t) { return std::string(engine::tier_name(t)); };
  const nlohmann::json config = {
      {"placement",
       {{"weights", tier(pl.weights)},
        {"states", tier(pl.states)},
        {"activations", tier(pl.activations)},
        {"gradients", tier(pl.gradients)}}},
      {"session", {{"prefetch_depth", pl.prefetch_depth}, {"resident_first", plan.setup.model->resident_first()}}},
      {"speculate_in_ram", pl.speculate_in_ram}};
  return nlohmann::json{{"config", config},
                        {"fits", engine::fits(plan, budgets)},
                        {"device_bytes", plan.device.total()},
                        {"host_bytes", plan.host.total()},
                        {"nvme_bytes", plan.nvme.total()},
                        {"step_seconds", plan.step_seconds},
                        {"plan", engine::format_plan(plan, budgets)}}
      .dump();
}

}  // namespace

extern "C" {

strata_status strata_session_create(const char* config_json, const char* device, strata_session** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return strata::invalid_argument("strata_session_create: out is NULL");
    *out = nullptr;
    auto s = std::make_unique<strata_session>();
    STRATA_ASSIGN_OR_RETURN(SessionConfig c,
                            session_config("strata_session_create", config_json, device, &s->warnings));
    STRATA_ASSIGN_OR_RETURN(s->session, engine::Session::create(std::move(c.options)));
    *out = s.release();
    return strata::ok_status();
  });
}

void strata_session_destroy(strata_session* session) {
  if (session == nullptr) return;
  session->device_memory.clear();  // back to the device before it goes
  delete session;
}

strata_status strata_session_add_chunk(strata_session* session, const char* name, int64_t count,
                                       const float* initial, int64_t* chunk) {
  return guarded([&]() -> Status {
    engine::ChunkInit init;
    if (initial != nullptr && count > 0) {
      // Copied now: the caller's array may go once this returns.
      auto values = std::make_shared<std::vector<float>>(initial, initial + count);
      init = [values](std::span<float> dst) {
        std::memcpy(dst.data(), values->data(), dst.size() * sizeof(float));
        return strata::ok_status();
      };
    }
    return add_chunk(session, "strata_session_add_chunk", name, count, std::move(init), chunk);
  });
}

strata_status strata_session_add_chunk_fn(strata_session* session, const char* name, int64_t count,
                                          strata_chunk_init_fn init, void* user, int64_t* chunk) {
  return guarded([&]() -> Status {
    if (init == nullptr) return strata::invalid_argument("strata_session_add_chunk_fn: init is NULL");
    const auto index = static_cast<int64_t>(session == nullptr ? 0 : session->session->chunks());
    engine::ChunkInit fn = [init, user, index](std::span<float> dst) -> Status {
      const int rc = init(user, index, dst.data(), static_cast<int64_t>(dst.size()));
      if (rc != 0) return strata::invalid_argument("the init callback returned " + std::to_string(rc));
      return strata::ok_status();
    };
    return add_chunk(session, "strata_session_add_chunk_fn", name, count, std::move(fn), chunk);
  });
}

strata_status strata_session_set_chunk_dtype(strata_session* session, int64_t chunk, const char* dtype) {
  return guarded([&]() -> Status {
    const char* call = "strata_session_set_chunk_dtype";
    STRATA_RETURN_IF_ERROR(usable(session, call));
    STRATA_ASSIGN_OR_RETURN(size_t c, chunk_of(session, call, chunk));
    STRATA_ASSIGN_OR_RETURN(strata::DType t, dtype_of(call, dtype));
    return session->session->set_chunk_dtype(c, t);
  });
}

strata_status strata_session_chunk_dtype(const strata_session* session, int64_t chunk, const char** dtype) {
  return guarded([&]() -> Status {
    const char* call = "strata_session_chunk_dtype";
    STRATA_RETURN_IF_ERROR(usable(session, call));
    if (dtype == nullptr) return strata::invalid_argument(std::string(call) + ": dtype is NULL");
    STRATA_ASSIGN_OR_RETURN(size_t c, chunk_of(session, call, chunk));
    *dtype = strata::dtype_name(session->session->chunk_dtype(c)).data();  // a literal: static, NUL-terminated
    return strata::ok_status();
  });
}

strata_status strata_session_add_tensor(strata_session* session, int64_t chunk, const char* name, int64_t offset,
                                        const int64_t* shape, int ndim) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_add_tensor"));
    if (name == nullptr) return strata::invalid_argument("strata_session_add_tensor: name is NULL");
    if (shape == nullptr || ndim < 1 || ndim > 8) {
      return strata::invalid_argument("strata_session_add_tensor: a shape of 1..8 dimensions, got " +
                                      std::string(shape == nullptr ? "NULL" : std::to_string(ndim)));
    }
    STRATA_ASSIGN_OR_RETURN(size_t c, chunk_of(session, "strata_session_add_tensor", chunk));
    return session->session->add_tensor(c, {name, offset, std::vector<int64_t>(shape, shape + ndim)});
  });
}

strata_status strata_session_start(strata_session* session) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_start"));
    return session->session->start();
  });
}

strata_status strata_session_set_lr(strata_session* session, double lr) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_set_lr"));
    return session->session->set_lr(lr);
  });
}

strata_status strata_session_set_gradient_order(strata_session* session, const int64_t* order, int64_t count) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_set_gradient_order"));
    if (order == nullptr || count < 0) {
      return strata::invalid_argument("strata_session_set_gradient_order: order is NULL or count < 0");
    }
    std::vector<size_t> chunks;
    for (int64_t k = 0; k < count; ++k) {
      if (order[k] < 0) return strata::invalid_argument("strata_session_set_gradient_order: a negative chunk index");
      chunks.push_back(static_cast<size_t>(order[k]));
    }
    return session->session->set_gradient_order(std::move(chunks));
  });
}

double strata_session_loss_scale(const strata_session* session) {
  return session == nullptr ? 1.0 : session->session->loss_scale();
}

strata_status strata_session_set_loss_scale(strata_session* session, double scale) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_set_loss_scale"));
    return session->session->set_loss_scale(scale);
  });
}

strata_status strata_session_precision(const strata_session* session, int* is_fp16) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_precision"));
    if (is_fp16 != nullptr) *is_fp16 = session->session->precision() == strata::DType::kF16 ? 1 : 0;
    return strata::ok_status();
  });
}

strata_status strata_session_begin_step(strata_session* session, float grad_scale) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_begin_step"));
    return session->session->begin_step(grad_scale);
  });
}

strata_status strata_session_acquire(strata_session* session, int64_t chunk, void* stream, const void** weights) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_acquire"));
    if (weights == nullptr) return strata::invalid_argument("strata_session_acquire: weights is NULL");
    STRATA_ASSIGN_OR_RETURN(size_t c, chunk_of(session, "strata_session_acquire", chunk));
    STRATA_ASSIGN_OR_RETURN(strata::gpu::Stream s, stream_of(session, stream));
    STRATA_ASSIGN_OR_RETURN(*weights, session->session->acquire(c, s));
    return strata::ok_status();
  });
}

strata_status strata_session_release(strata_session* session, int64_t chunk) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_release"));
    STRATA_ASSIGN_OR_RETURN(size_t c, chunk_of(session, "strata_session_release", chunk));
    return session->session->release(c);
  });
}

strata_status strata_session_gradient_buffer(strata_session* session, int64_t chunk, void** gradient) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_gradient_buffer"));
    if (gradient == nullptr) return strata::invalid_argument("strata_session_gradient_buffer: gradient is NULL");
    STRATA_ASSIGN_OR_RETURN(size_t c, chunk_of(session, "strata_session_gradient_buffer", chunk));
    STRATA_ASSIGN_OR_RETURN(*gradient, session->session->gradient_buffer(c));
    return strata::ok_status();
  });
}

strata_status strata_session_submit_gradient(strata_session* session, int64_t chunk, void* stream) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_submit_gradient"));
    STRATA_ASSIGN_OR_RETURN(size_t c, chunk_of(session, "strata_session_submit_gradient", chunk));
    STRATA_ASSIGN_OR_RETURN(strata::gpu::Stream s, stream_of(session, stream));
    return session->session->submit_gradient(c, s);
  });
}

strata_status strata_session_end_step(strata_session* session, strata_step_verdict* verdict) {
  return guarded([&]() -> Status {
    const char* call = "strata_session_end_step";
    STRATA_RETURN_IF_ERROR(usable(session, call));
    if (verdict != nullptr) {  // refused before the step ends
      STRATA_RETURN_IF_ERROR(strata::bindings::check_struct_size(call, "verdict", &verdict->struct_size));
    }
    STRATA_ASSIGN_OR_RETURN(engine::StepVerdict v, session->session->end_step());
    if (verdict == nullptr) return strata::ok_status();
    const strata_step_verdict out{sizeof(strata_step_verdict), v.step,      v.grad_norm,
                                  v.clipped ? 1 : 0,           v.skipped ? 1 : 0, v.rolled_back ? 1 : 0,
                                  v.lr,                        v.loss_scale};
    return strata::bindings::write_struct(call, "verdict", out, verdict);
  });
}

strata_status strata_session_cancel_step(strata_session* session) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_cancel_step"));
    return session->session->cancel_step();
  });
}

strata_status strata_session_save_activation(strata_session* session, uint64_t key, const void* device_src,
                                             size_t bytes) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_save_activation"));
    return session->session->save_activation(key, device_src, bytes);
  });
}

strata_status strata_session_load_activation(strata_session* session, uint64_t key, void* device_dst, size_t bytes) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_load_activation"));
    return session->session->load_activation(key, device_dst, bytes);
  });
}

strata_status strata_session_prefetch_activation(strata_session* session, uint64_t key, void* device_dst,
                                                 size_t bytes) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_prefetch_activation"));
    return session->session->prefetch_activation(key, device_dst, bytes);
  });
}

strata_status strata_session_save_activation_on(strata_session* session, uint64_t key, const void* device_src,
                                                size_t bytes, void* stream) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_save_activation_on"));
    STRATA_ASSIGN_OR_RETURN(strata::gpu::Stream s, stream_of(session, stream));  // NULL: none, the blocking call
    return session->session->save_activation(key, device_src, bytes, s);
  });
}

strata_status strata_session_activation_saved(strata_session* session, uint64_t key, void* stream) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_activation_saved"));
    STRATA_ASSIGN_OR_RETURN(strata::gpu::Stream s, stream_of(session, stream));
    return session->session->activation_saved(key, s);
  });
}

strata_status strata_session_load_activation_on(strata_session* session, uint64_t key, void* device_dst, size_t bytes,
                                                void* stream) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_load_activation_on"));
    STRATA_ASSIGN_OR_RETURN(strata::gpu::Stream s, stream_of(session, stream));  // NULL: none, the blocking call
    return session->session->load_activation(key, device_dst, bytes, s);
  });
}

strata_status strata_session_prefetch_activation_on(strata_session* session, uint64_t key, void* device_dst,
                                                    size_t bytes, void* stream) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_prefetch_activation_on"));
    STRATA_ASSIGN_OR_RETURN(strata::gpu::Stream s, stream_of(session, stream));  // NULL: none, the blocking call
    return session->session->prefetch_activation(key, device_dst, bytes, s);
  });
}

strata_status strata_session_device_alloc(strata_session* session, size_t bytes, void** memory) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_device_alloc"));
    if (memory == nullptr) return strata::invalid_argument("strata_session_device_alloc: memory is NULL");
    *memory = nullptr;
    STRATA_ASSIGN_OR_RETURN(strata::gpu::DeviceMemory m,
                            session->session->allocate_device(bytes, "strata_session_device_alloc"));
    void* p = m.data();
    session->device_memory.emplace(p, std::move(m));
    *memory = p;
    return strata::ok_status();
  });
}

strata_status strata_session_device_free(strata_session* session, void* memory) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_device_free"));
    if (memory == nullptr) return strata::ok_status();
    if (session->device_memory.erase(memory) == 0) {
      return strata::invalid_argument("strata_session_device_free: not memory of strata_session_device_alloc");
    }
    return strata::ok_status();
  });
}

strata_status strata_session_read_master(strata_session* session, int64_t chunk, float* dst, int64_t count) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_read_master"));
    if (dst == nullptr || count < 0) return strata::invalid_argument("strata_session_read_master: dst is NULL");
    STRATA_ASSIGN_OR_RETURN(size_t c, chunk_of(session, "strata_session_read_master", chunk));
    return session->session->read_master(c, std::span<float>(dst, static_cast<size_t>(count)));
  });
}

int64_t strata_session_steps_done(const strata_session* session) {
  return session == nullptr ? 0 : session->session->steps_done();
}

strata_status strata_session_save(strata_session* session, const char* dir) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_save"));
    if (dir == nullptr) return strata::invalid_argument("strata_session_save: dir is NULL");
    return session->session->save(dir);
  });
}

strata_status strata_session_load(strata_session* session, const char* dir) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_load"));
    if (dir == nullptr) return strata::invalid_argument("strata_session_load: dir is NULL");
    return session->session->load(dir);
  });
}

const char* strata_session_describe(strata_session* session) {
  if (session == nullptr) return nullptr;
  try {
    const engine::Session& s = *session->session;
    const engine::SessionOptions& o = s.options();
    nlohmann::json chunks = nlohmann::json::array();
    for (size_t c = 0; c < s.chunks(); ++c)
      chunks.push_back(
          {{"name", s.chunk_name(c)}, {"count", s.chunk_elems(c)}, {"dtype", strata::dtype_name(s.chunk_dtype(c))}});
    const engine::SessionCounters k = s.counters();
    session->description = nlohmann::json{
        {"chunks", chunks},
        {"placement",
         {{"weights", engine::tier_name(o.weights)},
          {"states", engine::tier_name(o.states)},
          {"activations", engine::tier_name(o.activations)},
          {"gradients", engine::tier_name(o.gradients)},
          {"delayed_update", o.delayed_update},
          {"prefetch_depth", o.prefetch_depth},
          {"resident_first", o.resident_first},
          {"speculate_in_ram", o.speculate_in_ram && o.states == engine::Tier::kHost}}},
        {"budgets", {{"device", o.device_bytes}, {"host", o.host_budget_bytes}, {"nvme", o.nvme_budget_bytes}}},
        {"steps_done", s.steps_done()},
        {"counters",
         {{"h2d_bytes", k.h2d_bytes},
          {"d2h_bytes", k.d2h_bytes},
          {"nvme_read_bytes", k.nvme_read_bytes},
          {"nvme_written_bytes", k.nvme_written_bytes},
          {"device_peak_bytes", k.device_peak_bytes},
          {"device_wait_s", k.device_wait_s},
          {"host_bytes", s.host_bytes()}}},
        {"warnings",
         session->warnings}}.dump();
  } catch (const std::exception& e) {
    report(strata::internal_error(std::string("strata_session_describe: ") + e.what()));
    session->description = "{}";
  }
  return session->description.c_str();
}

strata_status strata_session_finalize(strata_session* session) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_finalize"));
    return session->session->finalize();
  });
}

strata_status strata_session_abort(strata_session* session) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_abort"));
    session->session->abort();
    return strata::ok_status();
  });
}

strata_status strata_session_async_error(strata_session* session) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(session, "strata_session_async_error"));
    return session->session->async_error();
  });
}

strata_status strata_session_plan(const char* config_json, const char* device, const strata_model_plan* model,
                                  char* text, size_t capacity, size_t* length) {
  return guarded([&]() -> Status {
    const char* call = "strata_session_plan";
    if (text == nullptr && capacity > 0)
      return strata::invalid_argument(std::string(call) + ": text is NULL, capacity not 0");
    STRATA_ASSIGN_OR_RETURN(const strata_model_plan m, strata::bindings::read_struct(call, "model", model));
    STRATA_ASSIGN_OR_RETURN(std::vector<strata::DType> dtypes, check_model_plan(&m));
    std::vector<std::string> warnings;
    STRATA_ASSIGN_OR_RETURN(SessionConfig c, session_config(call, config_json, device, &warnings));
    engine::Budgets budgets = engine::budgets_or_defaults(c.config.budgets);
    if (c.config.nvme_paths.empty()) budgets.nvme_bytes = 0;
    STRATA_ASSIGN_OR_RETURN(
        engine::Plan plan,
        engine::plan_session(c.options, std::make_shared<CPlanModel>(m, std::move(dtypes)), m.micro_batch,
                             budgets, engine::Bandwidths{}, c.config.constraints));
    return strata::bindings::copy_text(call, plan_json(plan, budgets), text, capacity, length);
  });
}

}  // extern "C"
