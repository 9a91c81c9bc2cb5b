// A GPT-2-style model on the host ops: one block's forward and backward on
// its flat parameter chunk (gpt_config.h's block_layout), and a whole-model
// forward/backward that keeps every activation (the engine instead keeps
// only block inputs and recomputes). Templated like ops.h: float is the host
// backend, double the reference the tests check gradients with.
#pragma once

#include <cstdint>
#include <vector>

#include "models/gpt/gpt_config.h"

namespace strata::gpt::host {

// One block's working memory for B*T = N rows: what backward keeps from
// forward, and backward's scratch. The members are views: resize() backs them
// with owned storage, bind() with caller memory of elements() values (a
// capped device's allocation, so the budget sees every byte).
template <class T>
struct BlockActivations {
  T *ln1 = nullptr, *ln1_mean = nullptr, *ln1_rstd = nullptr;  // [N,C], [N], [N]
  T* qkv = nullptr;                                            // [N,3C]
  T* lse = nullptr;                                            // [B,NH,T] attention's log-sum-exp
  T* atty = nullptr;                                           // [N,C] attention output before c_proj
  T* res2 = nullptr;                                           // [N,C] x + attention
  T *ln2 = nullptr, *ln2_mean = nullptr, *ln2_rstd = nullptr;  // [N,C], [N], [N]
  T *fch = nullptr, *fch_gelu = nullptr;                       // [N,4C]
  // scratch: tmp, dres2, dln2, datty, dln1 [N,C]; dgelu, dfch [N,4C]; dqkv [N,3C];
  // att_scratch: attention's row blocks (attention_scratch_elements)
  T *tmp = nullptr, *dres2 = nullptr, *dgelu = nullptr, *dfch = nullptr, *dln2 = nullptr, *datty = nullptr,
    *dqkv = nullptr, *dln1 = nullptr, *att_scratch = nullptr;

  static int64_t elements(const GptConfig& config, int64_t B, int64_t seq);
  void resize(const GptConfig& config, int64_t B, int64_t seq);
  void bind(T* base, const GptConfig& config, int64_t B, int64_t seq);

 private:
  std::vector<T> storage_;
};

// x_out[N,C] = block(x_in[N,C]) with the block's parameters at `params`
// (a chunk in block_layout order); fills `acts`.
template <class T>
void block_forward(const GptConfig& config, const T* params, const T* x_in, T* x_out, BlockActivations<T>& acts,
                   int64_t B, int64_t seq);
// dparams (same layout) += and dx_in[N,C] += the gradients for dx_out[N,C].
template <class T>
void block_backward(const GptConfig& config, const T* params, T* dparams, const T* x_in,
                    const BlockActivations<T>& acts, const T* dx_out, T* dx_in, int64_t B, int64_t seq);

// Whole-model parameters / gradients: one pointer per chunk, in model_layout order.
template <class T>
struct ModelParams {
  std::vector<T*> chunks;
};

template <class T>
class HostGpt {
 public:
  HostGpt(const GptConfig& config, int64_t B, int64_t seq);
  // Mean cross-entropy of targets[B,T] given tokens[B,T]; keeps activations.
  T forward(const ModelParams<T>& params, const int32_t* tokens, const int32_t* targets);
  // grads += d(mean loss)/d(params), after forward() with the same inputs.
  // `dloss` scales the loss's gradient (fp16 loss scaling).
  void backward(const ModelParams<T>& params, const ModelParams<T>& grads, T dloss = T(1));
  // After forward(): each position's most likely next token (the argmax of
  // its logits, the lowest index on a tie) into out[B*T] — greedy
  // decoding's choice given the true prefix.
  void predict(const ModelParams<T>& params, int32_t* out) const;

 private:
  GptConfig config_;
  int64_t B_, T_;
  std::vector<int32_t> tokens_, targets_;
  std::vector<std::vector<T>> x_;  // residual stream: x_[0] embeddings ... x_[L] last block out
  std::vector<BlockActivations<T>> acts_;
  std::vector<T> lnf_, lnf_mean_, lnf_rstd_, lse_;
};

}  // namespace strata::gpt::host
