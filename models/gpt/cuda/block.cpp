#include "models/gpt/cuda/block.h"

#include "gpu/cuda/cuda_check.h"

namespace strata::gpt::cuda {

using namespace gpu;
using namespace gpu::cuda;

namespace {

Status zero(cudaStream_t s, DeviceMemory& m) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(m.data(), 0, m.bytes(), s));  // +0 in every storage type
  return ok_status();
}

}  // namespace

Result<BlockBuffers> allocate_block_buffers(Device& d, const GptConfig& c, int64_t B, int64_t seq, int64_t elem_bytes) {
  if (elem_bytes != 2 && elem_bytes != 4) {
    return invalid_argument("allocate_block_buffers: elem_bytes must be 2 or 4, got " + std::to_string(elem_bytes));
  }
  const uint64_t N = static_cast<uint64_t>(B * seq), C = static_cast<uint64_t>(c.hidden);
  const uint64_t e = static_cast<uint64_t>(elem_bytes), f = 4;
  const uint64_t rows = static_cast<uint64_t>(B * c.heads * seq) * f;  // one fp32 per (sequence, head, row)
  BlockBuffers b;
  auto get = [&](DeviceMemory& m, uint64_t bytes, const char* what) -> Status {
    STRATA_ASSIGN_OR_RETURN(m, d.allocate(bytes, what));
    return ok_status();
  };
  STRATA_RETURN_IF_ERROR(get(b.ln1, N * C * e, "block activations (ln_1)"));
  STRATA_RETURN_IF_ERROR(get(b.ln1_mean, N * f, "block activations (ln_1 mean)"));
  STRATA_RETURN_IF_ERROR(get(b.ln1_rstd, N * f, "block activations (ln_1 rstd)"));
  STRATA_RETURN_IF_ERROR(get(b.qkv, N * 3 * C * e, "block activations (qkv)"));
  STRATA_RETURN_IF_ERROR(get(b.lse, rows, "block activations (attention log-sum-exp)"));
  STRATA_RETURN_IF_ERROR(get(b.atty, N * C * e, "block activations (attention out)"));
  STRATA_RETURN_IF_ERROR(get(b.res2, N * C * e, "block activations (residual)"));
  STRATA_RETURN_IF_ERROR(get(b.ln2, N * C * e, "block activations (ln_2)"));
  STRATA_RETURN_IF_ERROR(get(b.ln2_mean, N * f, "block activations (ln_2 mean)"));
  STRATA_RETURN_IF_ERROR(get(b.ln2_rstd, N * f, "block activations (ln_2 rstd)"));
  STRATA_RETURN_IF_ERROR(get(b.fch, N * 4 * C * e, "block activations (c_fc)"));
  STRATA_RETURN_IF_ERROR(get(b.fch_gelu, N * 4 * C * e, "block activations (gelu)"));
  STRATA_RETURN_IF_ERROR(get(b.tmp, N * C * e, "block scratch"));
  STRATA_RETURN_IF_ERROR(get(b.dres2, N * C * e, "block gradients (residual)"));
  STRATA_RETURN_IF_ERROR(get(b.dgelu, N * 4 * C * e, "block gradients (gelu)"));
  STRATA_RETURN_IF_ERROR(get(b.dfch, N * 4 * C * e, "block gradients (c_fc)"));
  STRATA_RETURN_IF_ERROR(get(b.dln2, N * C * e, "block gradients (ln_2)"));
  STRATA_RETURN_IF_ERROR(get(b.datty, N * C * e, "block gradients (attention out)"));
  STRATA_RETURN_IF_ERROR(get(b.dqkv, N * 3 * C * e, "block gradients (qkv)"));
  STRATA_RETURN_IF_ERROR(get(b.dln1, N * C * e, "block gradients (ln_1)"));
  STRATA_RETURN_IF_ERROR(get(b.drow, rows, "block gradients (attention row terms)"));
  return b;
}

template <class T>
Status block_forward(const BlasContext& ctx, cudaStream_t s, const GptConfig& c, const T* p, const T* x_in, T* x_out,
                     BlockBuffers& a, int64_t B, int64_t seq) {
  const BlockOffsets o = block_offsets(c);
  const int64_t N = B * seq, C = c.hidden;
  STRATA_RETURN_IF_ERROR(layernorm_forward(s, a.ln1.as<T>(), a.ln1_mean.as<float>(), a.ln1_rstd.as<float>(), x_in,
                                           p + o.ln1w, p + o.ln1b, N, C));
  STRATA_RETURN_IF_ERROR(
      matmul_forward(ctx, s, a.qkv.as<T>(), a.ln1.as<T>(), p + o.attnw, p + o.attnb, N, C, 3 * C));
  STRATA_RETURN_IF_ERROR(
      flash_attention_forward(s, a.atty.as<T>(), a.lse.as<float>(), a.qkv.as<T>(), B, seq, C, c.heads));
  STRATA_RETURN_IF_ERROR(matmul_forward(ctx, s, a.tmp.as<T>(), a.atty.as<T>(), p + o.projw, p + o.projb, N, C, C));
  STRATA_RETURN_IF_ERROR(residual_forward(s, a.res2.as<T>(), x_in, a.tmp.as<T>(), N * C));
  STRATA_RETURN_IF_ERROR(layernorm_forward(s, a.ln2.as<T>(), a.ln2_mean.as<float>(), a.ln2_rstd.as<float>(),
                                           a.res2.as<T>(), p + o.ln2w, p + o.ln2b, N, C));
  STRATA_RETURN_IF_ERROR(matmul_forward(ctx, s, a.fch.as<T>(), a.ln2.as<T>(), p + o.fcw, p + o.fcb, N, C, 4 * C));
  STRATA_RETURN_IF_ERROR(gelu_forward(s, a.fch_gelu.as<T>(), a.fch.as<T>(), N * 4 * C));
  STRATA_RETURN_IF_ERROR(
      matmul_forward(ctx, s, a.tmp.as<T>(), a.fch_gelu.as<T>(), p + o.fcprojw, p + o.fcprojb, N, 4 * C, C));
  return residual_forward(s, x_out, a.res2.as<T>(), a.tmp.as<T>(), N * C);
}

template <class T>
Status block_backward(const BlasContext& ctx, cudaStream_t s, const GptConfig& c, const T* p, T* dp, const T* x_in,
                      BlockBuffers& a, const T* dx_out, T* dx_in, int64_t B, int64_t seq) {
  const BlockOffsets o = block_offsets(c);
  const int64_t N = B * seq, C = c.hidden;
  for (DeviceMemory* m : {&a.dgelu, &a.dfch, &a.dln2, &a.datty, &a.dqkv, &a.dln1}) STRATA_RETURN_IF_ERROR(zero(s, *m));
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(a.dres2.data(), dx_out, static_cast<size_t>(N * C) * sizeof(T), cudaMemcpyDeviceToDevice, s));
  STRATA_RETURN_IF_ERROR(matmul_backward(ctx, s, a.dgelu.as<T>(), dp + o.fcprojw, dp + o.fcprojb, dx_out,
                                         a.fch_gelu.as<T>(), p + o.fcprojw, N, 4 * C, C));
  STRATA_RETURN_IF_ERROR(gelu_backward(s, a.dfch.as<T>(), a.fch.as<T>(), a.dgelu.as<T>(), N * 4 * C));
  STRATA_RETURN_IF_ERROR(matmul_backward(ctx, s, a.dln2.as<T>(), dp + o.fcw, dp + o.fcb, a.dfch.as<T>(), a.ln2.as<T>(),
                                         p + o.fcw, N, C, 4 * C));
  STRATA_RETURN_IF_ERROR(layernorm_backward(s, a.dres2.as<T>(), dp + o.ln2w, dp + o.ln2b, a.dln2.as<T>(),
                                            a.res2.as<T>(), p + o.ln2w, a.ln2_mean.as<float>(),
                                            a.ln2_rstd.as<float>(), N, C));
  STRATA_RETURN_IF_ERROR(accumulate(s, dx_in, a.dres2.as<T>(), N * C));
  STRATA_RETURN_IF_ERROR(matmul_backward(ctx, s, a.datty.as<T>(), dp + o.projw, dp + o.projb, a.dres2.as<T>(),
                                         a.atty.as<T>(), p + o.projw, N, C, C));
  STRATA_RETURN_IF_ERROR(flash_attention_backward(s, a.dqkv.as<T>(), a.drow.as<float>(), a.datty.as<T>(),
                                                  a.atty.as<T>(), a.qkv.as<T>(), a.lse.as<float>(), B, seq, C,
                                                  c.heads));
  STRATA_RETURN_IF_ERROR(matmul_backward(ctx, s, a.dln1.as<T>(), dp + o.attnw, dp + o.attnb, a.dqkv.as<T>(),
                                         a.ln1.as<T>(), p + o.attnw, N, C, 3 * C));
  return layernorm_backward(s, dx_in, dp + o.ln1w, dp + o.ln1b, a.dln1.as<T>(), x_in, p + o.ln1w,
                            a.ln1_mean.as<float>(), a.ln1_rstd.as<float>(), N, C);
}

#define STRATA_CUDA_BLOCK_INSTANTIATE(T)                                                                          \
  template Status block_forward<T>(const BlasContext&, cudaStream_t, const GptConfig&, const T*, const T*, T*,     \
                                   BlockBuffers&, int64_t, int64_t);                                             \
  template Status block_backward<T>(const BlasContext&, cudaStream_t, const GptConfig&, const T*, T*, const T*,    \
                                    BlockBuffers&, const T*, T*, int64_t, int64_t);

STRATA_CUDA_BLOCK_INSTANTIATE(float)
STRATA_CUDA_BLOCK_INSTANTIATE(__nv_bfloat16)
STRATA_CUDA_BLOCK_INSTANTIATE(__half)

}  // namespace strata::gpt::cuda
