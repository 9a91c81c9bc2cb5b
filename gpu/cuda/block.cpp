#include "gpu/cuda/block.h"

#include "gpu/cuda/cuda_check.h"

namespace strata::gpu::cuda {
namespace {


Status zero(cudaStream_t s, DeviceMemory& m) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(m.data(), 0, m.bytes(), s));
  return ok_status();
}

}  // namespace

Result<BlockBuffers> allocate_block_buffers(Device& d, const GptConfig& c, int64_t B, int64_t seq) {
  const uint64_t N = static_cast<uint64_t>(B * seq), C = static_cast<uint64_t>(c.hidden), f = 4;
  const uint64_t att = static_cast<uint64_t>(B * c.heads * seq * seq) * f;
  BlockBuffers b;
  auto get = [&](DeviceMemory& m, uint64_t bytes, const char* what) -> Status {
    STRATA_ASSIGN_OR_RETURN(m, d.allocate(bytes, what));
    return ok_status();
  };
  STRATA_RETURN_IF_ERROR(get(b.ln1, N * C * f, "block activations (ln_1)"));
  STRATA_RETURN_IF_ERROR(get(b.ln1_mean, N * f, "block activations (ln_1 mean)"));
  STRATA_RETURN_IF_ERROR(get(b.ln1_rstd, N * f, "block activations (ln_1 rstd)"));
  STRATA_RETURN_IF_ERROR(get(b.qkv, N * 3 * C * f, "block activations (qkv)"));
  STRATA_RETURN_IF_ERROR(get(b.att, att, "block activations (attention probabilities)"));
  STRATA_RETURN_IF_ERROR(get(b.atty, N * C * f, "block activations (attention out)"));
  STRATA_RETURN_IF_ERROR(get(b.res2, N * C * f, "block activations (residual)"));
  STRATA_RETURN_IF_ERROR(get(b.ln2, N * C * f, "block activations (ln_2)"));
  STRATA_RETURN_IF_ERROR(get(b.ln2_mean, N * f, "block activations (ln_2 mean)"));
  STRATA_RETURN_IF_ERROR(get(b.ln2_rstd, N * f, "block activations (ln_2 rstd)"));
  STRATA_RETURN_IF_ERROR(get(b.fch, N * 4 * C * f, "block activations (c_fc)"));
  STRATA_RETURN_IF_ERROR(get(b.fch_gelu, N * 4 * C * f, "block activations (gelu)"));
  STRATA_RETURN_IF_ERROR(get(b.tmp, N * C * f, "block scratch"));
  STRATA_RETURN_IF_ERROR(get(b.dres2, N * C * f, "block gradients (residual)"));
  STRATA_RETURN_IF_ERROR(get(b.dgelu, N * 4 * C * f, "block gradients (gelu)"));
  STRATA_RETURN_IF_ERROR(get(b.dfch, N * 4 * C * f, "block gradients (c_fc)"));
  STRATA_RETURN_IF_ERROR(get(b.dln2, N * C * f, "block gradients (ln_2)"));
  STRATA_RETURN_IF_ERROR(get(b.datty, N * C * f, "block gradients (attention out)"));
  STRATA_RETURN_IF_ERROR(get(b.dqkv, N * 3 * C * f, "block gradients (qkv)"));
  STRATA_RETURN_IF_ERROR(get(b.dln1, N * C * f, "block gradients (ln_1)"));
  STRATA_RETURN_IF_ERROR(get(b.dpre, att, "block gradients (attention scores)"));
  return b;
}

Status block_forward(const BlasContext& ctx, cudaStream_t s, const GptConfig& c, const float* p, const float* x_in,
                     float* x_out, BlockBuffers& a, int64_t B, int64_t seq) {
  const BlockOffsets o = block_offsets(c);
  const int64_t N = B * seq, C = c.hidden;
  STRATA_RETURN_IF_ERROR(layernorm_forward(s, a.ln1.as<float>(), a.ln1_mean.as<float>(), a.ln1_rstd.as<float>(), x_in,
                                           p + o.ln1w, p + o.ln1b, N, C));
  STRATA_RETURN_IF_ERROR(matmul_forward(ctx, s, a.qkv.as<float>(), a.ln1.as<float>(), p + o.attnw, p + o.attnb, N, C,
                                        3 * C));
  STRATA_RETURN_IF_ERROR(attention_forward(s, a.atty.as<float>(), a.att.as<float>(), a.qkv.as<float>(), B, seq, C,
                                           c.heads));
  STRATA_RETURN_IF_ERROR(matmul_forward(ctx, s, a.tmp.as<float>(), a.atty.as<float>(), p + o.projw, p + o.projb, N, C,
                                        C));
  STRATA_RETURN_IF_ERROR(residual_forward(s, a.res2.as<float>(), x_in, a.tmp.as<float>(), N * C));
  STRATA_RETURN_IF_ERROR(layernorm_forward(s, a.ln2.as<float>(), a.ln2_mean.as<float>(), a.ln2_rstd.as<float>(),
                                           a.res2.as<float>(), p + o.ln2w, p + o.ln2b, N, C));
  STRATA_RETURN_IF_ERROR(matmul_forward(ctx, s, a.fch.as<float>(), a.ln2.as<float>(), p + o.fcw, p + o.fcb, N, C,
                                        4 * C));
  STRATA_RETURN_IF_ERROR(gelu_forward(s, a.fch_gelu.as<float>(), a.fch.as<float>(), N * 4 * C));
  STRATA_RETURN_IF_ERROR(matmul_forward(ctx, s, a.tmp.as<float>(), a.fch_gelu.as<float>(), p + o.fcprojw,
                                        p + o.fcprojb, N, 4 * C, C));
  return residual_forward(s, x_out, a.res2.as<float>(), a.tmp.as<float>(), N * C);
}

Status block_backward(const BlasContext& ctx, cudaStream_t s, const GptConfig& c, const float* p, float* dp,
                      const float* x_in, BlockBuffers& a, const float* dx_out, float* dx_in, int64_t B, int64_t seq) {
  const BlockOffsets o = block_offsets(c);
  const int64_t N = B * seq, C = c.hidden;
  for (DeviceMemory* m : {&a.dgelu, &a.dfch, &a.dln2, &a.datty, &a.dqkv, &a.dln1}) STRATA_RETURN_IF_ERROR(zero(s, *m));
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(a.dres2.data(), dx_out, static_cast<size_t>(N * C) * 4, cudaMemcpyDeviceToDevice, s));
  STRATA_RETURN_IF_ERROR(matmul_backward(ctx, s, a.dgelu.as<float>(), dp + o.fcprojw, dp + o.fcprojb, dx_out,
                                         a.fch_gelu.as<float>(), p + o.fcprojw, N, 4 * C, C));
  STRATA_RETURN_IF_ERROR(gelu_backward(s, a.dfch.as<float>(), a.fch.as<float>(), a.dgelu.as<float>(), N * 4 * C));
  STRATA_RETURN_IF_ERROR(matmul_backward(ctx, s, a.dln2.as<float>(), dp + o.fcw, dp + o.fcb, a.dfch.as<float>(),
                                         a.ln2.as<float>(), p + o.fcw, N, C, 4 * C));
  STRATA_RETURN_IF_ERROR(layernorm_backward(s, a.dres2.as<float>(), dp + o.ln2w, dp + o.ln2b, a.dln2.as<float>(),
                                            a.res2.as<float>(), p + o.ln2w, a.ln2_mean.as<float>(),
                                            a.ln2_rstd.as<float>(), N, C));
  STRATA_RETURN_IF_ERROR(accumulate(s, dx_in, a.dres2.as<float>(), N * C));
  STRATA_RETURN_IF_ERROR(matmul_backward(ctx, s, a.datty.as<float>(), dp + o.projw, dp + o.projb, a.dres2.as<float>(),
                                         a.atty.as<float>(), p + o.projw, N, C, C));
  STRATA_RETURN_IF_ERROR(attention_backward(s, a.dqkv.as<float>(), a.dpre.as<float>(), a.datty.as<float>(),
                                            a.qkv.as<float>(), a.att.as<float>(), B, seq, C, c.heads));
  STRATA_RETURN_IF_ERROR(matmul_backward(ctx, s, a.dln1.as<float>(), dp + o.attnw, dp + o.attnb, a.dqkv.as<float>(),
                                         a.ln1.as<float>(), p + o.attnw, N, C, 3 * C));
  return layernorm_backward(s, dx_in, dp + o.ln1w, dp + o.ln1b, a.dln1.as<float>(), x_in, p + o.ln1w,
                            a.ln1_mean.as<float>(), a.ln1_rstd.as<float>(), N, C);
}

}  // namespace strata::gpu::cuda
