// The GPT's ops on a CUDA GPU: the CUDA launchers (gpu/cuda/ops.h, block.h) in T =
// float, __nv_bfloat16 or __half on the CudaDevice's streams. The
// workspace: one block's buffers (block.h) and the head's LayerNorm output
// and gradient (T), statistics, per-row log-sum-exp and the chunked loss's
// workspace (fp32).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "models/gpt/cuda/gpt_ops.h"

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/ops.h"
#include "models/gpt/cuda/block.h"
#include "models/gpt/cuda/workspace.h"

namespace strata::gpt::cuda {

using namespace gpu;
using namespace gpu::cuda;

namespace {

struct CudaWorkspace final : public GptOps::Workspace {
  CudaWorkspace(int64_t B, int64_t seq) : Workspace(B, seq) {}
  BlockBuffers block;
  DeviceMemory lnf, dlnf, mean, rstd, lse, ce;
};

template <class T>
class CudaGptOps final : public GptOps {
 public:
  CudaGptOps(CudaDevice& dev, const GptConfig& config, BlasContext blas, DType dtype)
      : dev_(dev), config_(config), blas_(std::move(blas)), dtype_(dtype), ends_(end_offsets(config)) {}

  DType dtype() const override { return dtype_; }
  const GptConfig& config() const override { return config_; }

  uint64_t workspace_bytes(int64_t B, int64_t seq) const override {
    return cuda_workspace_bytes(config_, sizeof(T), B, seq).total();
  }

  Result<std::unique_ptr<Workspace>> workspace(int64_t B, int64_t seq) override {
    if (B < 1 || seq < 1 || seq > config_.max_seq) {
      return invalid_argument("model ops workspace: needs B >= 1 and 1 <= T <= max_seq (" +
                              std::to_string(config_.max_seq) + "), got B=" + std::to_string(B) +
                              " T=" + std::to_string(seq));
    }
    auto ws = std::make_unique<CudaWorkspace>(B, seq);
    STRATA_ASSIGN_OR_RETURN(ws->block, allocate_block_buffers(dev_, config_, B, seq, sizeof(T)));
    const uint64_t N = static_cast<uint64_t>(B * seq), C = static_cast<uint64_t>(config_.hidden);
    STRATA_ASSIGN_OR_RETURN(ws->lnf, dev_.allocate(N * C * sizeof(T), "head activations (ln_f)"));
    STRATA_ASSIGN_OR_RETURN(ws->dlnf, dev_.allocate(N * C * sizeof(T), "head gradients (ln_f)"));
    STRATA_ASSIGN_OR_RETURN(ws->mean, dev_.allocate(N * 4, "head activations (ln_f mean)"));
    STRATA_ASSIGN_OR_RETURN(ws->rstd, dev_.allocate(N * 4, "head activations (ln_f rstd)"));
    STRATA_ASSIGN_OR_RETURN(ws->lse, dev_.allocate(N * 4, "head activations (loss log-sum-exp)"));
    STRATA_ASSIGN_OR_RETURN(
        ws->ce, dev_.allocate(static_cast<uint64_t>(crossentropy_workspace_floats(B * seq)) * 4, "loss workspace"));
    return std::unique_ptr<Workspace>(std::move(ws));
  }

  Status embedding_forward(Stream s, Workspace& w, const void* embedding, const int32_t* tokens,
                           void* x_out) override {
    STRATA_ASSIGN_OR_RETURN(cudaStream_t cs, dev_.native(s));
    const T* e = static_cast<const T*>(embedding);
    return gpu::cuda::embedding_forward(cs, static_cast<T*>(x_out), tokens, e + ends_.wte,
                                   e + ends_.wpe, w.batch(), w.seq(), config_.hidden);
  }

  Status embedding_backward(Stream s, Workspace& w, void* dembedding, const int32_t* tokens,
                            const void* dx) override {
    STRATA_ASSIGN_OR_RETURN(cudaStream_t cs, dev_.native(s));
    T* d = static_cast<T*>(dembedding);
    return gpu::cuda::embedding_backward(cs, d + ends_.wte, d + ends_.wpe,
                                    static_cast<const T*>(dx), tokens, w.batch(), w.seq(), config_.hidden);
  }

  Status block_forward(Stream s, Workspace& w, const void* params, const void* x_in, void* x_out) override {
    STRATA_ASSIGN_OR_RETURN(cudaStream_t cs, dev_.native(s));
    return gpt::cuda::block_forward(blas_, cs, config_, static_cast<const T*>(params), static_cast<const T*>(x_in),
                               static_cast<T*>(x_out), static_cast<CudaWorkspace&>(w).block, w.batch(), w.seq());
  }

  Status block_backward(Stream s, Workspace& w, const void* params, void* dparams, const void* x_in,
                        const void* dx_out, void* dx_in) override {
    STRATA_ASSIGN_OR_RETURN(cudaStream_t cs, dev_.native(s));
    return gpt::cuda::block_backward(blas_, cs, config_, static_cast<const T*>(params), static_cast<T*>(dparams),
                                static_cast<const T*>(x_in), static_cast<CudaWorkspace&>(w).block,
                                static_cast<const T*>(dx_out), static_cast<T*>(dx_in), w.batch(), w.seq());
  }

  Status head_forward(Stream s, Workspace& w, const void* final_chunk, const void* embedding, const void* x,
                      const int32_t* targets, float* loss) override {
    STRATA_ASSIGN_OR_RETURN(cudaStream_t cs, dev_.native(s));
    CudaWorkspace& ws = static_cast<CudaWorkspace&>(w);
    const int64_t N = w.batch() * w.seq(), C = config_.hidden;
    const T* f = static_cast<const T*>(final_chunk);
    STRATA_RETURN_IF_ERROR(layernorm_forward(cs, ws.lnf.as<T>(), ws.mean.as<float>(), ws.rstd.as<float>(),
                                             static_cast<const T*>(x), f + ends_.lnfw,
                                             f + ends_.lnfb, N, C));
    return crossentropy_forward(blas_, cs, loss, ws.lse.as<float>(), ws.ce.as<float>(), ws.lnf.as<T>(),
                                static_cast<const T*>(embedding) + ends_.wte, targets, N, C,
                                config_.vocab);
  }

  Status head_backward(Stream s, Workspace& w, const void* final_chunk, void* dfinal, const void* embedding,
                       void* dembedding, const void* x, const int32_t* targets, float dloss, void* dx) override {
    STRATA_ASSIGN_OR_RETURN(cudaStream_t cs, dev_.native(s));
    CudaWorkspace& ws = static_cast<CudaWorkspace&>(w);
    const int64_t N = w.batch() * w.seq(), C = config_.hidden;
    const T* f = static_cast<const T*>(final_chunk);
    T* df = static_cast<T*>(dfinal);
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ws.dlnf.data(), 0, ws.dlnf.bytes(), cs));
    STRATA_RETURN_IF_ERROR(crossentropy_backward(blas_, cs, ws.dlnf.as<T>(),
                                                 static_cast<T*>(dembedding) + ends_.wte,
                                                 ws.ce.as<float>(), ws.lnf.as<T>(),
                                                 static_cast<const T*>(embedding) + ends_.wte, targets,
                                                 ws.lse.as<float>(), dloss, N, C, config_.vocab));
    return layernorm_backward(cs, static_cast<T*>(dx), df + ends_.lnfw, df + ends_.lnfb,
                              ws.dlnf.as<T>(), static_cast<const T*>(x), f + ends_.lnfw,
                              ws.mean.as<float>(), ws.rstd.as<float>(), N, C);
  }

  Status zero(Stream s, void* data, uint64_t bytes) override {
    STRATA_ASSIGN_OR_RETURN(cudaStream_t cs, dev_.native(s));
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data, 0, bytes, cs));
    return ok_status();
  }

 private:
  CudaDevice& dev_;
  GptConfig config_;
  BlasContext blas_;
  DType dtype_;
  EndOffsets ends_;
};

}  // namespace

Result<std::unique_ptr<GptOps>> make_cuda_gpt_ops(CudaDevice& device, const GptConfig& config, DType dtype) {
  STRATA_RETURN_IF_ERROR(config.validate());
  STRATA_ASSIGN_OR_RETURN(BlasContext blas, BlasContext::create(device.device_index()));
  switch (dtype) {
    case DType::kF32:
      return std::unique_ptr<GptOps>(std::make_unique<CudaGptOps<float>>(device, config, std::move(blas), dtype));
    case DType::kBF16:
      return std::unique_ptr<GptOps>(
          std::make_unique<CudaGptOps<__nv_bfloat16>>(device, config, std::move(blas), dtype));
    case DType::kF16:
      return std::unique_ptr<GptOps>(std::make_unique<CudaGptOps<__half>>(device, config, std::move(blas), dtype));
  }
  return invalid_argument("GPT ops: unknown dtype");
}

}  // namespace strata::gpt::cuda
