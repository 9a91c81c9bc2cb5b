#include "gpu/host/gpt.h"

#include "common/check.h"
#include "gpu/host/ops.h"

namespace strata::gpu::host {
template <class T>
void BlockActivations<T>::resize(const GptConfig& c, int64_t B, int64_t seq) {
  const size_t N = static_cast<size_t>(B * seq), C = static_cast<size_t>(c.hidden);
  ln1.resize(N * C), ln1_mean.resize(N), ln1_rstd.resize(N), qkv.resize(N * 3 * C);
  att.resize(static_cast<size_t>(B * c.heads * seq * seq)), atty.resize(N * C), res2.resize(N * C);
  ln2.resize(N * C), ln2_mean.resize(N), ln2_rstd.resize(N), fch.resize(N * 4 * C), fch_gelu.resize(N * 4 * C);
}

template <class T>
void block_forward(const GptConfig& c, const T* p, const T* x_in, T* x_out, BlockActivations<T>& a, int64_t B,
                   int64_t seq) {
  const BlockOffsets o = block_offsets(c);
  const int64_t N = B * seq, C = c.hidden;
  std::vector<T> tmp(static_cast<size_t>(N * C));
  layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x_in, p + o.ln1w, p + o.ln1b, N, C);
  matmul_forward(a.qkv.data(), a.ln1.data(), p + o.attnw, p + o.attnb, N, C, 3 * C);
  attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), B, seq, C, c.heads);
  matmul_forward(tmp.data(), a.atty.data(), p + o.projw, p + o.projb, N, C, C);
  residual_forward(a.res2.data(), x_in, tmp.data(), N * C);
  layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), p + o.ln2w, p + o.ln2b, N, C);
  matmul_forward(a.fch.data(), a.ln2.data(), p + o.fcw, p + o.fcb, N, C, 4 * C);
  gelu_forward(a.fch_gelu.data(), a.fch.data(), N * 4 * C);
  matmul_forward(tmp.data(), a.fch_gelu.data(), p + o.fcprojw, p + o.fcprojb, N, 4 * C, C);
  residual_forward(x_out, a.res2.data(), tmp.data(), N * C);
}

template <class T>
void block_backward(const GptConfig& c, const T* p, T* dp, const T* x_in, const BlockActivations<T>& a,
                    const T* dx_out, T* dx_in, int64_t B, int64_t seq) {
  const BlockOffsets o = block_offsets(c);
  const int64_t N = B * seq, C = c.hidden;
  // x_out = res2 + mlp(res2): d res2 = dx_out + mlp backward
  std::vector<T> dres2(dx_out, dx_out + N * C), dgelu(static_cast<size_t>(N * 4 * C), T(0));
  std::vector<T> dfch(static_cast<size_t>(N * 4 * C), T(0)), dln2(static_cast<size_t>(N * C), T(0));
  matmul_backward(dgelu.data(), dp + o.fcprojw, dp + o.fcprojb, dx_out, a.fch_gelu.data(), p + o.fcprojw, N, 4 * C, C);
  gelu_backward(dfch.data(), a.fch.data(), dgelu.data(), N * 4 * C);
  matmul_backward(dln2.data(), dp + o.fcw, dp + o.fcb, dfch.data(), a.ln2.data(), p + o.fcw, N, C, 4 * C);
  layernorm_backward(dres2.data(), dp + o.ln2w, dp + o.ln2b, dln2.data(), a.res2.data(), p + o.ln2w,
                     a.ln2_mean.data(), a.ln2_rstd.data(), N, C);
  // res2 = x_in + attn(x_in)
  accumulate(dx_in, dres2.data(), N * C);
  std::vector<T> datty(static_cast<size_t>(N * C), T(0)), dqkv(static_cast<size_t>(N * 3 * C), T(0));
  std::vector<T> dln1(static_cast<size_t>(N * C), T(0));
  matmul_backward(datty.data(), dp + o.projw, dp + o.projb, dres2.data(), a.atty.data(), p + o.projw, N, C, C);
  attention_backward(dqkv.data(), datty.data(), a.qkv.data(), a.att.data(), B, seq, C, c.heads);
  matmul_backward(dln1.data(), dp + o.attnw, dp + o.attnb, dqkv.data(), a.ln1.data(), p + o.attnw, N, C, 3 * C);
  layernorm_backward(dx_in, dp + o.ln1w, dp + o.ln1b, dln1.data(), x_in, p + o.ln1w, a.ln1_mean.data(),
                     a.ln1_rstd.data(), N, C);
}

template <class T>
HostGpt<T>::HostGpt(const GptConfig& config, int64_t B, int64_t seq) : config_(config), B_(B), T_(seq) {
  STRATA_CHECK(config.validate().ok() && seq <= config.max_seq && B >= 1 && seq >= 1);
  const size_t NC = static_cast<size_t>(B * seq * config.hidden);
  x_.assign(static_cast<size_t>(config.layers + 1), std::vector<T>(NC));
  acts_.resize(static_cast<size_t>(config.layers));
  for (BlockActivations<T>& a : acts_) a.resize(config, B, seq);
  lnf_.resize(NC), lnf_mean_.resize(static_cast<size_t>(B * seq)), lnf_rstd_.resize(static_cast<size_t>(B * seq));
  lse_.resize(static_cast<size_t>(B * seq));
}

template <class T>
T HostGpt<T>::forward(const ModelParams<T>& params, const int32_t* tokens, const int32_t* targets) {
  const GptConfig& c = config_;
  STRATA_CHECK(params.chunks.size() == static_cast<size_t>(c.layers + 2));
  const int64_t N = B_ * T_, C = c.hidden;
  tokens_.assign(tokens, tokens + N);
  targets_.assign(targets, targets + N);
  const ChunkLayout emb = embedding_layout(c), fin = final_layout(c);
  const T* wte = params.chunks[0] + emb.tensors[0].offset;
  embedding_forward(x_[0].data(), tokens, wte, params.chunks[0] + emb.tensors[1].offset, B_, T_, C);
  for (int64_t l = 0; l < c.layers; ++l) {
    block_forward(c, params.chunks[static_cast<size_t>(l + 1)], x_[l].data(), x_[l + 1].data(), acts_[l], B_, T_);
  }
  const T* lnf = params.chunks.back();
  layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x_.back().data(), lnf + fin.tensors[0].offset,
                    lnf + fin.tensors[1].offset, N, C);
  return crossentropy_forward(lse_.data(), lnf_.data(), wte, targets, N, C, c.vocab);
}

template <class T>
void HostGpt<T>::backward(const ModelParams<T>& params, const ModelParams<T>& grads) {
  const GptConfig& c = config_;
  const int64_t N = B_ * T_, C = c.hidden;
  const ChunkLayout emb = embedding_layout(c), fin = final_layout(c);
  const T* wte = params.chunks[0] + emb.tensors[0].offset;
  T* dwte = grads.chunks[0] + emb.tensors[0].offset;
  std::vector<T> dlnf(static_cast<size_t>(N * C), T(0)), dx(static_cast<size_t>(N * C), T(0));
  crossentropy_backward(dlnf.data(), dwte, lnf_.data(), wte, targets_.data(), lse_.data(), T(1), N, C, c.vocab);
  const T* lnf = params.chunks.back();
  T* dlnfp = grads.chunks.back();
  layernorm_backward(dx.data(), dlnfp + fin.tensors[0].offset, dlnfp + fin.tensors[1].offset, dlnf.data(),
                     x_.back().data(), lnf + fin.tensors[0].offset, lnf_mean_.data(), lnf_rstd_.data(), N, C);
  for (int64_t l = c.layers - 1; l >= 0; --l) {
    std::vector<T> dx_in(static_cast<size_t>(N * C), T(0));
    block_backward(c, params.chunks[static_cast<size_t>(l + 1)], grads.chunks[static_cast<size_t>(l + 1)],
                   x_[l].data(), acts_[l], dx.data(), dx_in.data(), B_, T_);
    dx.swap(dx_in);
  }
  embedding_backward(dwte, grads.chunks[0] + emb.tensors[1].offset, dx.data(), tokens_.data(), B_, T_, C);
}

template struct BlockActivations<float>;
template struct BlockActivations<double>;
template void block_forward<float>(const GptConfig&, const float*, const float*, float*, BlockActivations<float>&,
                                   int64_t, int64_t);
template void block_forward<double>(const GptConfig&, const double*, const double*, double*,
                                    BlockActivations<double>&, int64_t, int64_t);
template void block_backward<float>(const GptConfig&, const float*, float*, const float*,
                                    const BlockActivations<float>&, const float*, float*, int64_t, int64_t);
template void block_backward<double>(const GptConfig&, const double*, double*, const double*,
                                     const BlockActivations<double>&, const double*, double*, int64_t, int64_t);
template class HostGpt<float>;
template class HostGpt<double>;

}  // namespace strata::gpu::host
