#include "models/gpt/host/gpt.h"

#include <algorithm>

#include "common/check.h"
#include "gpu/host/ops.h"

namespace strata::gpt::host {

using namespace gpu::host;

template <class T>
int64_t BlockActivations<T>::elements(const GptConfig& c, int64_t B, int64_t seq) {
  const int64_t N = B * seq, C = c.hidden;
  // kept: ln1, atty, res2, ln2 (4 NC), qkv (3 NC), fch, fch_gelu (8 NC), stats (4 N), lse (B NH T);
  // scratch: tmp, dres2, dln2, datty, dln1 (5 NC), dgelu, dfch (8 NC), dqkv (3 NC), attention's row blocks
  return 31 * N * C + 4 * N + B * c.heads * seq + attention_scratch_elements(seq);
}

template <class T>
void BlockActivations<T>::resize(const GptConfig& c, int64_t B, int64_t seq) {
  storage_.assign(static_cast<size_t>(elements(c, B, seq)), T(0));
  bind(storage_.data(), c, B, seq);
}

template <class T>
void BlockActivations<T>::bind(T* base, const GptConfig& c, int64_t B, int64_t seq) {
  const int64_t N = B * seq, C = c.hidden;
  T* p = base;
  auto take = [&](int64_t n) {
    T* out = p;
    p += n;
    return out;
  };
  ln1 = take(N * C), ln1_mean = take(N), ln1_rstd = take(N), qkv = take(3 * N * C);
  lse = take(B * c.heads * seq), atty = take(N * C), res2 = take(N * C);
  ln2 = take(N * C), ln2_mean = take(N), ln2_rstd = take(N), fch = take(4 * N * C), fch_gelu = take(4 * N * C);
  tmp = take(N * C), dres2 = take(N * C), dgelu = take(4 * N * C), dfch = take(4 * N * C), dln2 = take(N * C);
  datty = take(N * C), dqkv = take(3 * N * C), dln1 = take(N * C), att_scratch = take(attention_scratch_elements(seq));
  STRATA_CHECK(p - base == elements(c, B, seq));
}

template <class T>
void block_forward(const GptConfig& c, const T* p, const T* x_in, T* x_out, BlockActivations<T>& a, int64_t B,
                   int64_t seq) {
  const BlockOffsets o = block_offsets(c);
  const int64_t N = B * seq, C = c.hidden;
  layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_in, p + o.ln1w, p + o.ln1b, N, C);
  matmul_forward(a.qkv, a.ln1, p + o.attnw, p + o.attnb, N, C, 3 * C);
  flash_attention_forward(a.atty, a.lse, a.att_scratch, a.qkv, B, seq, C, c.heads);
  matmul_forward(a.tmp, a.atty, p + o.projw, p + o.projb, N, C, C);
  residual_forward(a.res2, x_in, a.tmp, N * C);
  layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p + o.ln2w, p + o.ln2b, N, C);
  matmul_forward(a.fch, a.ln2, p + o.fcw, p + o.fcb, N, C, 4 * C);
  gelu_forward(a.fch_gelu, a.fch, N * 4 * C);
  matmul_forward(a.tmp, a.fch_gelu, p + o.fcprojw, p + o.fcprojb, N, 4 * C, C);
  residual_forward(x_out, a.res2, a.tmp, N * C);
}

template <class T>
void block_backward(const GptConfig& c, const T* p, T* dp, const T* x_in, const BlockActivations<T>& a,
                    const T* dx_out, T* dx_in, int64_t B, int64_t seq) {
  const BlockOffsets o = block_offsets(c);
  const int64_t N = B * seq, C = c.hidden;
  // x_out = res2 + mlp(res2): d res2 = dx_out + mlp backward
  std::copy(dx_out, dx_out + N * C, a.dres2);
  for (T* z : {a.dgelu, a.dfch}) std::fill(z, z + N * 4 * C, T(0));
  for (T* z : {a.dln2, a.datty, a.dln1}) std::fill(z, z + N * C, T(0));
  std::fill(a.dqkv, a.dqkv + N * 3 * C, T(0));
  matmul_backward(a.dgelu, dp + o.fcprojw, dp + o.fcprojb, dx_out, a.fch_gelu, p + o.fcprojw, N, 4 * C, C);
  gelu_backward(a.dfch, a.fch, a.dgelu, N * 4 * C);
  matmul_backward(a.dln2, dp + o.fcw, dp + o.fcb, a.dfch, a.ln2, p + o.fcw, N, C, 4 * C);
  layernorm_backward(a.dres2, dp + o.ln2w, dp + o.ln2b, a.dln2, a.res2, p + o.ln2w, a.ln2_mean, a.ln2_rstd, N, C);
  // res2 = x_in + attn(x_in)
  accumulate(dx_in, a.dres2, N * C);
  matmul_backward(a.datty, dp + o.projw, dp + o.projb, a.dres2, a.atty, p + o.projw, N, C, C);
  flash_attention_backward(a.dqkv, a.att_scratch, a.datty, a.atty, a.qkv, a.lse, B, seq, C, c.heads);
  matmul_backward(a.dln1, dp + o.attnw, dp + o.attnb, a.dqkv, a.ln1, p + o.attnw, N, C, 3 * C);
  layernorm_backward(dx_in, dp + o.ln1w, dp + o.ln1b, a.dln1, x_in, p + o.ln1w, a.ln1_mean, a.ln1_rstd, N, C);
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
void HostGpt<T>::backward(const ModelParams<T>& params, const ModelParams<T>& grads, T dloss) {
  const GptConfig& c = config_;
  const int64_t N = B_ * T_, C = c.hidden;
  const ChunkLayout emb = embedding_layout(c), fin = final_layout(c);
  const T* wte = params.chunks[0] + emb.tensors[0].offset;
  T* dwte = grads.chunks[0] + emb.tensors[0].offset;
  std::vector<T> dlnf(static_cast<size_t>(N * C), T(0)), dx(static_cast<size_t>(N * C), T(0));
  crossentropy_backward(dlnf.data(), dwte, lnf_.data(), wte, targets_.data(), lse_.data(), dloss, N, C, c.vocab);
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

template <class T>
void HostGpt<T>::predict(const ModelParams<T>& params, int32_t* out) const {
  const GptConfig& c = config_;
  const int64_t N = B_ * T_, C = c.hidden, V = c.vocab;
  const T* wte = params.chunks[0] + embedding_layout(c).tensors[0].offset;
  for (int64_t n = 0; n < N; ++n) {
    const T* x = lnf_.data() + n * C;
    int32_t best = 0;
    T best_logit = T(0);
    for (int64_t v = 0; v < V; ++v) {
      T logit = T(0);
      for (int64_t k = 0; k < C; ++k) logit += x[k] * wte[v * C + k];
      if (v == 0 || logit > best_logit) best = static_cast<int32_t>(v), best_logit = logit;
    }
    out[n] = best;
  }
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

}  // namespace strata::gpt::host
