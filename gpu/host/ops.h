// The transformer ops of the host backend, forward and backward, on plain
// row-major arrays. Templated on the element type: float is the host
// backend; double runs the same code for the finite-difference tests. GEMMs go
// through OpenBLAS; everything else is plain loops (parallelised by the
// BLAS calls only, for now). Backward functions ACCUMULATE into their
// gradient outputs (+=), as gradients of shared weights must.
// Shapes: B batch, T sequence, C hidden, NH heads, V vocab, N = B*T rows.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace strata::gpu::host {

// The cores the host ops compute on (BLAS threads and the row-parallel
// loops), for the whole process; 0 = every core. A host "device" that
// shares a machine with the CPU optimizer leaves it some cores, as a GPU
// would. Row results do not depend on it. Not while ops run.
void set_compute_threads(int threads);
int compute_threads();

// out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :]
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B, int64_t seq, int64_t C);
// dwte[V,C] += scatter of dout; dwpe[T,C] += sum over batch of dout
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t seq, int64_t C);

// out[N,C] = (x - mean) * rstd * w + b, eps 1e-5 (GPT-2); saves mean[N], rstd[N]
template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t N, int64_t C);
// dx[N,C], dw[C], db[C] += from dout[N,C]
template <class T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean, const T* rstd,
                        int64_t N, int64_t C);

// out[N,OC] = x[N,IC] @ w[IC,OC] + bias[OC]  (GPT-2 Conv1D layout: w is [in, out]; bias may be null)
template <class T>
void matmul_forward(T* out, const T* x, const T* w, const T* bias, int64_t N, int64_t IC, int64_t OC);
// dx[N,IC] += dout @ w^T; dw[IC,OC] += x^T @ dout; dbias[OC] += column sums of dout (dbias may be null)
template <class T>
void matmul_backward(T* dx, T* dw, T* dbias, const T* dout, const T* x, const T* w, int64_t N, int64_t IC,
                     int64_t OC);

// Causal multi-head attention. qkv[B,T,3C] holds q, k, v (each [NH, hs] per
// token); out[B,T,C]; att[B,NH,T,T] receives the softmax probabilities
// (row t uses columns 0..t; the rest are 0).
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t seq, int64_t C, int64_t NH);
// dqkv[B,T,3C] += from dout[B,T,C], using the saved att
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B, int64_t seq, int64_t C,
                        int64_t NH);

// The same attention keeping only each row's log-sum-exp for backward
// (FlashAttention's contract): lse[B,NH,T]; backward recomputes the
// probabilities from q, k and lse. No [T,T] matrix is ever held: queries go
// kAttnRows at a time, each row block scoring only the keys it may see, in
// `scratch` of attention_scratch_elements(seq) values. The CUDA backend's
// flash_attention_* have the same contract and outputs.
inline constexpr int64_t kAttnRows = 128;
inline constexpr int64_t attention_scratch_elements(int64_t seq) {
  return 2 * (seq < kAttnRows ? seq : kAttnRows) * seq;
}
template <class T>
void flash_attention_forward(T* out, T* lse, T* scratch, const T* qkv, int64_t B, int64_t seq, int64_t C, int64_t NH);
// dqkv[B,T,3C] += from dout[B,T,C]; out is the forward's output.
template <class T>
void flash_attention_backward(T* dqkv, T* scratch, const T* dout, const T* out, const T* qkv, const T* lse, int64_t B,
                              int64_t seq, int64_t C, int64_t NH);

// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <class T>
void gelu_forward(T* out, const T* x, int64_t n);
template <class T>
void gelu_backward(T* dx, const T* x, const T* dout, int64_t n);  // dx += gelu'(x) * dout

// out[n] = a[n] + b[n]; its backward is dout added to both inputs' gradients.
template <class T>
void residual_forward(T* out, const T* a, const T* b, int64_t n);
template <class T>
void accumulate(T* dst, const T* src, int64_t n);  // dst += src

// Loss of the tied output projection and softmax cross-entropy, fused:
// logits = x[N,C] @ wte[V,C]^T are produced kVocabChunk columns at a time and
// never stored whole. Returns the mean over rows of -log p(target); saves the
// per-row log-sum-exp lse[N] for the backward pass.
inline constexpr int64_t kVocabChunk = 4096;
template <class T>
T crossentropy_forward(T* lse, const T* x, const T* wte, const int32_t* targets, int64_t N, int64_t C, int64_t V);
// dx[N,C] += and dwte[V,C] += the gradients of dloss * mean loss.
template <class T>
void crossentropy_backward(T* dx, T* dwte, const T* x, const T* wte, const int32_t* targets, const T* lse, T dloss,
                           int64_t N, int64_t C, int64_t V);

// bf16 / fp16 storage (the host backend computes in fp32): n elements
// widened to fp32, narrowed back (round to nearest even), or dst += src
// rounded once.
void widen(const uint16_t* src, DType dtype, float* dst, int64_t n);
void narrow(const float* src, uint16_t* dst, DType dtype, int64_t n);
void add_rounded(uint16_t* dst, DType dtype, const float* src, int64_t n);

// The loss with the tied embedding stored in bf16 or fp16 (`wte_dtype`):
// its rows are widened kVocabChunk at a time, and dwte's rows are added
// back rounded, one chunk at a time. Everything else as above, in fp32.
float crossentropy_forward_lp(float* lse, const float* x, const uint16_t* wte, DType wte_dtype,
                              const int32_t* targets, int64_t N, int64_t C, int64_t V);
void crossentropy_backward_lp(float* dx, uint16_t* dwte, DType wte_dtype, const float* x, const uint16_t* wte,
                              const int32_t* targets, const float* lse, float dloss, int64_t N, int64_t C, int64_t V);

}  // namespace strata::gpu::host
