// The GPT's ops on the host backend: the host ops (gpu/host/ops.h, gpt.h),
// each call run as a task on the stream's worker thread of the HostDevice, in submission
// order. The host computes in fp32; with bf16 or fp16 storage (the
// parameters, activations between calls and gradients in device memory),
// each call widens its inputs into fp32 scratch in the workspace, runs the
// fp32 ops, and rounds its outputs back once (gradients: dst += fp32 sum,
// rounded once) — so the storage type's rounding happens where CUDA's
// does at a block's edges, not inside it. The workspace is one device
// allocation: the block's BlockActivations, the head's LayerNorm output and
// its gradient, statistics and per-row log-sum-exp, and for bf16/fp16 the
// fp32 scratch (a chunk's parameters and their gradient, three [N,C] rows).
#include <algorithm>
#include <cstring>
#include <string>

#include "gpu/host/host_device.h"
#include "gpu/host/ops.h"
#include "models/gpt/gpt_ops.h"
#include "models/gpt/host/gpt.h"
#include "models/gpt/host/gpt_ops.h"

namespace strata::gpt {

using gpu::DeviceMemory;

namespace {

class HostWorkspace final : public GptOps::Workspace {
 public:
  HostWorkspace(int64_t B, int64_t seq, DeviceMemory memory) : Workspace(B, seq), mem(std::move(memory)) {}
  DeviceMemory mem;
  host::BlockActivations<float> acts;
  float *lnf = nullptr, *dlnf = nullptr, *mean = nullptr, *rstd = nullptr, *lse = nullptr;
  // bf16 / fp16 storage only: widened parameters and their fp32 gradient, and three [N,C] rows.
  float *params = nullptr, *dparams = nullptr, *xa = nullptr, *xb = nullptr, *xc = nullptr;
};

class HostGptOps final : public GptOps {
 public:
  HostGptOps(gpu::Device& dev, const GptConfig& config, DType dtype)
      : dev_(dev), config_(config), dtype_(dtype), ends_(end_offsets(config)) {}

  DType dtype() const override { return dtype_; }
  const GptConfig& config() const override { return config_; }

  // One allocation, as the device charges it.
  uint64_t workspace_bytes(int64_t B, int64_t seq) const override {
    return gpu::device_allocation_bytes(host_gpt_ops_workspace_bytes(config_, dtype_, B, seq));
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
    if (low_precision()) {
      p = ws->lse + N;
      ws->params = p, ws->dparams = p + max_chunk();
      ws->xa = ws->dparams + max_chunk(), ws->xb = ws->xa + N * C, ws->xc = ws->xb + N * C;
    }
    return std::unique_ptr<Workspace>(std::move(ws));
  }

  Status embedding_forward(Stream s, Workspace& w, const void* embedding, const int32_t* tokens,
                           void* x_out) override {
    HostWorkspace* ws = &static_cast<HostWorkspace&>(w);
    const int64_t B = w.batch(), T = w.seq(), C = config_.hidden, wte = ends_.wte, wpe = ends_.wpe;
    const DType dt = dtype_;
    return dev_.enqueue(s, [=]() -> Status {
      if (dt == DType::kF32) {
        const float* e = static_cast<const float*>(embedding);
        gpu::host::embedding_forward(static_cast<float*>(x_out), tokens, e + wte, e + wpe, B, T, C);
        return ok_status();
      }
      // out = round(wte[token] + wpe[t]): both rows widened, added, rounded once
      const uint16_t* e = static_cast<const uint16_t*>(embedding);
      uint16_t* out = static_cast<uint16_t*>(x_out);
      float* row = ws->xa;
      float* pos = ws->xa + C;
      for (int64_t n = 0; n < B * T; ++n) {
        gpu::host::widen(e + wte + static_cast<int64_t>(tokens[n]) * C, dt, row, C);
        gpu::host::widen(e + wpe + (n % T) * C, dt, pos, C);
        for (int64_t c = 0; c < C; ++c) row[c] += pos[c];
        gpu::host::narrow(row, out + n * C, dt, C);
      }
      return ok_status();
    });
  }

  Status embedding_backward(Stream s, Workspace& w, void* dembedding, const int32_t* tokens,
                            const void* dx) override {
    HostWorkspace* ws = &static_cast<HostWorkspace&>(w);
    const int64_t B = w.batch(), T = w.seq(), C = config_.hidden, wte = ends_.wte, wpe = ends_.wpe;
    const DType dt = dtype_;
    return dev_.enqueue(s, [=]() -> Status {
      if (dt == DType::kF32) {
        float* d = static_cast<float*>(dembedding);
        gpu::host::embedding_backward(d + wte, d + wpe, static_cast<const float*>(dx), tokens, B, T, C);
        return ok_status();
      }
      // Row by row in order, as the fp32 op: each row added, rounded once.
      uint16_t* d = static_cast<uint16_t*>(dembedding);
      gpu::host::widen(static_cast<const uint16_t*>(dx), dt, ws->xa, B * T * C);
      for (int64_t n = 0; n < B * T; ++n) {
        gpu::host::add_rounded(d + wte + static_cast<int64_t>(tokens[n]) * C, dt, ws->xa + n * C, C);
        gpu::host::add_rounded(d + wpe + (n % T) * C, dt, ws->xa + n * C, C);
      }
      return ok_status();
    });
  }

  Status block_forward(Stream s, Workspace& w, const void* params, const void* x_in, void* x_out) override {
    HostWorkspace* ws = &static_cast<HostWorkspace&>(w);
    const GptConfig c = config_;
    const DType dt = dtype_;
    const int64_t numel = ends_.block_numel, NC = w.batch() * w.seq() * c.hidden;
    return dev_.enqueue(s, [=]() -> Status {
      if (dt == DType::kF32) {
        host::block_forward(c, static_cast<const float*>(params), static_cast<const float*>(x_in),
                            static_cast<float*>(x_out), ws->acts, ws->batch(), ws->seq());
        return ok_status();
      }
      gpu::host::widen(static_cast<const uint16_t*>(params), dt, ws->params, numel);
      gpu::host::widen(static_cast<const uint16_t*>(x_in), dt, ws->xa, NC);
      host::block_forward(c, ws->params, ws->xa, ws->xb, ws->acts, ws->batch(), ws->seq());
      gpu::host::narrow(ws->xb, static_cast<uint16_t*>(x_out), dt, NC);
      return ok_status();
    });
  }

  Status block_backward(Stream s, Workspace& w, const void* params, void* dparams, const void* x_in,
                        const void* dx_out, void* dx_in) override {
    HostWorkspace* ws = &static_cast<HostWorkspace&>(w);
    const GptConfig c = config_;
    const DType dt = dtype_;
    const int64_t numel = ends_.block_numel, NC = w.batch() * w.seq() * c.hidden;
    return dev_.enqueue(s, [=]() -> Status {
      if (dt == DType::kF32) {
        host::block_backward(c, static_cast<const float*>(params), static_cast<float*>(dparams),
                             static_cast<const float*>(x_in), ws->acts, static_cast<const float*>(dx_out),
                             static_cast<float*>(dx_in), ws->batch(), ws->seq());
        return ok_status();
      }
      gpu::host::widen(static_cast<const uint16_t*>(params), dt, ws->params, numel);
      gpu::host::widen(static_cast<const uint16_t*>(x_in), dt, ws->xa, NC);
      gpu::host::widen(static_cast<const uint16_t*>(dx_out), dt, ws->xb, NC);
      std::memset(ws->dparams, 0, static_cast<size_t>(numel) * 4);
      std::memset(ws->xc, 0, static_cast<size_t>(NC) * 4);
      host::block_backward(c, ws->params, ws->dparams, ws->xa, ws->acts, ws->xb, ws->xc, ws->batch(), ws->seq());
      gpu::host::add_rounded(static_cast<uint16_t*>(dparams), dt, ws->dparams, numel);
      gpu::host::add_rounded(static_cast<uint16_t*>(dx_in), dt, ws->xc, NC);
      return ok_status();
    });
  }

  Status head_forward(Stream s, Workspace& w, const void* final_chunk, const void* embedding, const void* x,
                      const int32_t* targets, float* loss) override {
    HostWorkspace* ws = &static_cast<HostWorkspace&>(w);
    const int64_t N = w.batch() * w.seq(), C = config_.hidden, V = config_.vocab;
    const EndOffsets o = ends_;
    const DType dt = dtype_;
    return dev_.enqueue(s, [=]() -> Status {
      const float *f = nullptr, *in = nullptr;
      if (dt == DType::kF32) {
        f = static_cast<const float*>(final_chunk);
        in = static_cast<const float*>(x);
      } else {
        gpu::host::widen(static_cast<const uint16_t*>(final_chunk), dt, ws->params, o.final_numel);
        gpu::host::widen(static_cast<const uint16_t*>(x), dt, ws->xa, N * C);
        f = ws->params;
        in = ws->xa;
      }
      gpu::host::layernorm_forward(ws->lnf, ws->mean, ws->rstd, in, f + o.lnfw, f + o.lnfb,
                              N, C);
      if (dt == DType::kF32) {
        const float* wte = static_cast<const float*>(embedding) + o.wte;
        *loss = gpu::host::crossentropy_forward(ws->lse, ws->lnf, wte, targets, N, C, V);
      } else {
        const uint16_t* wte = static_cast<const uint16_t*>(embedding) + o.wte;
        *loss = gpu::host::crossentropy_forward_lp(ws->lse, ws->lnf, wte, dt, targets, N, C, V);
      }
      return ok_status();
    });
  }

  Status head_backward(Stream s, Workspace& w, const void* final_chunk, void* dfinal, const void* embedding,
                       void* dembedding, const void* x, const int32_t* targets, float dloss, void* dx) override {
    HostWorkspace* ws = &static_cast<HostWorkspace&>(w);
    const int64_t N = w.batch() * w.seq(), C = config_.hidden, V = config_.vocab;
    const EndOffsets o = ends_;
    const DType dt = dtype_;
    return dev_.enqueue(s, [=]() -> Status {
      std::memset(ws->dlnf, 0, static_cast<size_t>(N * C) * 4);
      if (dt == DType::kF32) {
        const float* f = static_cast<const float*>(final_chunk);
        float* df = static_cast<float*>(dfinal);
        const float* wte = static_cast<const float*>(embedding) + o.wte;
        float* dwte = static_cast<float*>(dembedding) + o.wte;
        gpu::host::crossentropy_backward(ws->dlnf, dwte, ws->lnf, wte, targets, ws->lse, dloss, N, C, V);
        gpu::host::layernorm_backward(static_cast<float*>(dx), df + o.lnfw, df + o.lnfb,
                                 ws->dlnf, static_cast<const float*>(x), f + o.lnfw, ws->mean,
                                 ws->rstd, N, C);
        return ok_status();
      }
      const uint16_t* wte = static_cast<const uint16_t*>(embedding) + o.wte;
      uint16_t* dwte = static_cast<uint16_t*>(dembedding) + o.wte;
      gpu::host::crossentropy_backward_lp(ws->dlnf, dwte, dt, ws->lnf, wte, targets, ws->lse, dloss, N, C, V);
      gpu::host::widen(static_cast<const uint16_t*>(final_chunk), dt, ws->params, o.final_numel);
      gpu::host::widen(static_cast<const uint16_t*>(x), dt, ws->xa, N * C);
      std::memset(ws->dparams, 0, static_cast<size_t>(o.final_numel) * 4);
      std::memset(ws->xc, 0, static_cast<size_t>(N * C) * 4);
      gpu::host::layernorm_backward(ws->xc, ws->dparams + o.lnfw, ws->dparams + o.lnfb,
                               ws->dlnf, ws->xa, ws->params + o.lnfw, ws->mean, ws->rstd, N, C);
      gpu::host::add_rounded(static_cast<uint16_t*>(dfinal), dt, ws->dparams, o.final_numel);
      gpu::host::add_rounded(static_cast<uint16_t*>(dx), dt, ws->xc, N * C);
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
  bool low_precision() const { return dtype_ != DType::kF32; }
  int64_t max_chunk() const { return std::max(ends_.block_numel, ends_.final_numel); }

  gpu::Device& dev_;
  GptConfig config_;
  DType dtype_;
  EndOffsets ends_;
};

}  // namespace

uint64_t host_gpt_ops_workspace_bytes(const GptConfig& config, DType dtype, int64_t B, int64_t seq) {
  const int64_t N = B * seq, C = config.hidden;
  int64_t floats = host::BlockActivations<float>::elements(config, B, seq) + 2 * N * C + 3 * N;
  if (dtype != DType::kF32) {
    const EndOffsets ends = end_offsets(config);
    floats += 2 * std::max(ends.block_numel, ends.final_numel) + 3 * N * C;
  }
  return static_cast<uint64_t>(floats) * 4;
}

Result<std::unique_ptr<GptOps>> make_host_gpt_ops(gpu::HostDevice& device, const GptConfig& config, DType dtype) {
  STRATA_RETURN_IF_ERROR(config.validate());
  return std::unique_ptr<GptOps>(std::make_unique<HostGptOps>(device, config, dtype));
}

}  // namespace strata::gpt
