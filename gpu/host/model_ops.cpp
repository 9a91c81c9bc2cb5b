// The host backend's ModelOps: the host ops (ops.h, gpt.h) in fp32, each
// call run as a task on the stream's worker thread of the HostDevice, in
// submission order. The workspace is one device allocation: the block's
// BlockActivations, then the head's LayerNorm output and its gradient, its
// statistics and the loss's per-row log-sum-exp.
#include <cstring>

#include "gpu/host/gpt.h"
#include "gpu/host/host_device.h"
#include "gpu/host/ops.h"
#include "gpu/model_ops.h"

namespace strata::gpu {
namespace {

class HostWorkspace final : public ModelOps::Workspace {
 public:
  HostWorkspace(int64_t B, int64_t seq, DeviceMemory memory) : Workspace(B, seq), mem(std::move(memory)) {}
  DeviceMemory mem;
  host::BlockActivations<float> acts;
  float *lnf = nullptr, *dlnf = nullptr, *mean = nullptr, *rstd = nullptr, *lse = nullptr;
};

class HostModelOps final : public ModelOps {
 public:
  HostModelOps(HostDevice& dev, const GptConfig& config) : dev_(dev), config_(config) {}

  DType dtype() const override { return DType::kF32; }
  const GptConfig& config() const override { return config_; }

  uint64_t workspace_bytes(int64_t B, int64_t seq) const override {
    const int64_t N = B * seq;
    return static_cast<uint64_t>(host::BlockActivations<float>::elements(config_, B, seq) + 2 * N * config_.hidden +
                                 3 * N) *
           4;
  }

  Result<std::unique_ptr<Workspace>> workspace(int64_t B, int64_t seq) override {
    if (B < 1 || seq < 1 || seq > config_.max_seq) {
      return invalid_argument("model ops workspace: needs B >= 1 and 1 <= T <= max_seq (" +
                              std::to_string(config_.max_seq) + "), got B=" + std::to_string(B) +
                              " T=" + std::to_string(seq));
    }
    STRATA_ASSIGN_OR_RETURN(DeviceMemory mem, dev_.allocate(workspace_bytes(B, seq), "model ops workspace"));
    auto ws = std::make_unique<HostWorkspace>(B, seq, std::move(mem));
    const int64_t N = B * seq, C = config_.hidden;
    float* p = ws->mem.as<float>();
    ws->acts.bind(p, config_, B, seq);
    p += host::BlockActivations<float>::elements(config_, B, seq);
    ws->lnf = p, ws->dlnf = p + N * C, ws->mean = p + 2 * N * C, ws->rstd = ws->mean + N, ws->lse = ws->rstd + N;
    return std::unique_ptr<Workspace>(std::move(ws));
  }

  Status embedding_forward(Stream s, Workspace& w, const void* embedding, const int32_t* tokens,
                           void* x_out) override {
    const int64_t B = w.batch(), T = w.seq(), C = config_.hidden;
    const ChunkLayout emb = embedding_layout(config_);
    const float* e = static_cast<const float*>(embedding);
    float* out = static_cast<float*>(x_out);
    return dev_.enqueue(s, [=]() -> Status {
      host::embedding_forward(out, tokens, e + emb.tensors[0].offset, e + emb.tensors[1].offset, B, T, C);
      return ok_status();
    });
  }

  Status embedding_backward(Stream s, Workspace& w, void* dembedding, const int32_t* tokens,
                            const void* dx) override {
    const int64_t B = w.batch(), T = w.seq(), C = config_.hidden;
    const ChunkLayout emb = embedding_layout(config_);
    float* d = static_cast<float*>(dembedding);
    const float* g = static_cast<const float*>(dx);
    return dev_.enqueue(s, [=]() -> Status {
      host::embedding_backward(d + emb.tensors[0].offset, d + emb.tensors[1].offset, g, tokens, B, T, C);
      return ok_status();
    });
  }

  Status block_forward(Stream s, Workspace& w, const void* params, const void* x_in, void* x_out) override {
    HostWorkspace* ws = &static_cast<HostWorkspace&>(w);
    const GptConfig c = config_;
    const float *p = static_cast<const float*>(params), *x = static_cast<const float*>(x_in);
    float* y = static_cast<float*>(x_out);
    return dev_.enqueue(s, [=]() -> Status {
      host::block_forward(c, p, x, y, ws->acts, ws->batch(), ws->seq());
      return ok_status();
    });
  }

  Status block_backward(Stream s, Workspace& w, const void* params, void* dparams, const void* x_in,
                        const void* dx_out, void* dx_in) override {
    HostWorkspace* ws = &static_cast<HostWorkspace&>(w);
    const GptConfig c = config_;
    const float *p = static_cast<const float*>(params), *x = static_cast<const float*>(x_in);
    const float* dy = static_cast<const float*>(dx_out);
    float *dp = static_cast<float*>(dparams), *dx = static_cast<float*>(dx_in);
    return dev_.enqueue(s, [=]() -> Status {
      host::block_backward(c, p, dp, x, ws->acts, dy, dx, ws->batch(), ws->seq());
      return ok_status();
    });
  }

  Status head_forward(Stream s, Workspace& w, const void* final_chunk, const void* embedding, const void* x,
                      const int32_t* targets, float* loss) override {
    HostWorkspace* ws = &static_cast<HostWorkspace&>(w);
    const int64_t N = w.batch() * w.seq(), C = config_.hidden, V = config_.vocab;
    const ChunkLayout fin = final_layout(config_), emb = embedding_layout(config_);
    const float* f = static_cast<const float*>(final_chunk);
    const float* wte = static_cast<const float*>(embedding) + emb.tensors[0].offset;
    const float* in = static_cast<const float*>(x);
    return dev_.enqueue(s, [=]() -> Status {
      host::layernorm_forward(ws->lnf, ws->mean, ws->rstd, in, f + fin.tensors[0].offset, f + fin.tensors[1].offset,
                              N, C);
      *loss = host::crossentropy_forward(ws->lse, ws->lnf, wte, targets, N, C, V);
      return ok_status();
    });
  }

  Status head_backward(Stream s, Workspace& w, const void* final_chunk, void* dfinal, const void* embedding,
                       void* dembedding, const void* x, const int32_t* targets, float dloss, void* dx) override {
    HostWorkspace* ws = &static_cast<HostWorkspace&>(w);
    const int64_t N = w.batch() * w.seq(), C = config_.hidden, V = config_.vocab;
    const ChunkLayout fin = final_layout(config_), emb = embedding_layout(config_);
    const float* f = static_cast<const float*>(final_chunk);
    float* df = static_cast<float*>(dfinal);
    const float* wte = static_cast<const float*>(embedding) + emb.tensors[0].offset;
    float* dwte = static_cast<float*>(dembedding) + emb.tensors[0].offset;
    const float* in = static_cast<const float*>(x);
    float* dxp = static_cast<float*>(dx);
    return dev_.enqueue(s, [=]() -> Status {
      std::memset(ws->dlnf, 0, static_cast<size_t>(N * C) * 4);
      host::crossentropy_backward(ws->dlnf, dwte, ws->lnf, wte, targets, ws->lse, dloss, N, C, V);
      host::layernorm_backward(dxp, df + fin.tensors[0].offset, df + fin.tensors[1].offset, ws->dlnf, in,
                               f + fin.tensors[0].offset, ws->mean, ws->rstd, N, C);
      return ok_status();
    });
  }

  Status zero(Stream s, void* data, uint64_t bytes) override {
    return dev_.enqueue(s, [=]() -> Status {
      std::memset(data, 0, bytes);
      return ok_status();
    });
  }

 private:
  HostDevice& dev_;
  GptConfig config_;
};

}  // namespace

Result<std::unique_ptr<ModelOps>> HostDevice::model_ops(const GptConfig& config, DType dtype) {
  STRATA_RETURN_IF_ERROR(config.validate());
  if (dtype != DType::kF32) {
    return unimplemented("the host backend computes in fp32, not " + std::string(dtype_name(dtype)) +
                         " (bf16/fp16 weights are widened to fp32 before they reach it)");
  }
  return std::unique_ptr<ModelOps>(std::make_unique<HostModelOps>(*this, config));
}

}  // namespace strata::gpu
