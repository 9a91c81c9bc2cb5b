// GptConfig and the flat parameter layout of a GPT-2-style decoder.
//
// Model: token + learned position embedding; L pre-LayerNorm blocks of causal
// multi-head self-attention and a GELU(tanh) MLP; a final LayerNorm; the
// output projection tied to the token embedding; cross-entropy loss.
// Parameter names, shapes and order are GPT-2's (as in its safetensors), with
// GPT-2's Conv1D convention: a projection weight is [in, out].
//
// Parameters live in chunks — the unit the engine moves and updates: one
// "embedding" chunk (wte, wpe), one chunk per block, one "final" chunk
// (ln_f). Inside a chunk each tensor starts at a fixed element offset,
// aligned to kTensorAlignElems, so a chunk is one flat buffer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::gpt {

inline constexpr int64_t kTensorAlignElems = 64;  // 256 bytes of fp32, 128 of bf16

struct GptConfig {
  int64_t layers = 12;
  int64_t hidden = 768;     // C
  int64_t heads = 12;       // NH; hidden % heads == 0
  int64_t vocab = 50257;    // V
  int64_t max_seq = 1024;   // positions in wpe; a run's sequence length T <= max_seq

  Status validate() const;
  int64_t head_dim() const { return hidden / heads; }
};

// GPT-2 small/medium/large/xl shapes (vocab 50257, 1024 positions).
GptConfig gpt2_config(const std::string& size);

struct TensorSlot {
  std::string name;            // GPT-2 name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // row-major
  int64_t offset = 0;          // elements from the chunk start (multiple of kTensorAlignElems)
  int64_t numel() const;
};

enum class ChunkKind { kEmbedding, kBlock, kFinal };

struct ChunkLayout {
  ChunkKind kind = ChunkKind::kBlock;
  int64_t block = -1;          // layer index for kBlock
  std::vector<TensorSlot> tensors;
  int64_t numel = 0;           // padded size in elements (multiple of kTensorAlignElems)
  int64_t param_count = 0;     // sum of the tensors' numel (no padding)
  const TensorSlot& at(const std::string& suffix) const;  // by name suffix, e.g. "attn.c_attn.weight"
};

// Offsets of one block's tensors (identical for every block), in GPT-2 order:
// ln_1.{weight,bias}, attn.c_attn.{weight [C,3C], bias [3C]}, attn.c_proj.{weight [C,C], bias [C]},
// ln_2.{weight,bias}, mlp.c_fc.{weight [C,4C], bias [4C]}, mlp.c_proj.{weight [4C,C], bias [C]}.
ChunkLayout block_layout(const GptConfig& config, int64_t layer);
// The same offsets as named fields, for the code that runs a block.
struct BlockOffsets {
  int64_t ln1w, ln1b, attnw, attnb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
};
BlockOffsets block_offsets(const GptConfig& config);
// Where the model's ends keep their tensors, and the chunk sizes a backend
// sizes its scratch by: taken once, so per-call code needs no layout.
struct EndOffsets {
  int64_t wte, wpe;            // in the embedding chunk
  int64_t lnfw, lnfb;          // in the final chunk
  int64_t final_numel;         // the final chunk
  int64_t block_numel;         // every block chunk
};
EndOffsets end_offsets(const GptConfig& config);
ChunkLayout embedding_layout(const GptConfig& config);  // wte [V,C], wpe [max_seq,C]
ChunkLayout final_layout(const GptConfig& config);      // ln_f.{weight,bias} [C]
// Every chunk in model order: embedding, blocks 0..L-1, final.
std::vector<ChunkLayout> model_layout(const GptConfig& config);

// --- Formulas (docs/GPT.md derives them) ---
// Parameters: V*C + max_seq*C + L*(12*C^2 + 13*C) + 2*C.
int64_t parameter_count(const GptConfig& config);
int64_t block_parameter_count(const GptConfig& config);  // 12*C^2 + 13*C

// Model FLOPs per token at sequence length T (matmul and attention
// multiply-adds counted as 2 FLOPs; LayerNorm, GELU, softmax not counted):
//   forward = 2 * (12*C^2*L + V*C) + 4*L*T*C
//   training (forward + backward) = 3 * forward
//   training with per-block recompute = 4 * forward (the forward runs twice)
double forward_flops_per_token(const GptConfig& config, int64_t seq);
double training_flops_per_token(const GptConfig& config, int64_t seq, bool recompute);

// Activation bytes per token of one block while its forward+backward runs
// (the working set a recomputed block needs), for elements of `elem_bytes`:
//   16*C * elem_bytes  +  4*NH (attention's fp32 log-sum-exp per head)
//                      +  16 (4 fp32 LayerNorm statistics)
// (ln_1 out C, qkv 3C, attention out C, residual C, ln_2 out C, fc 4C,
//  gelu 4C, block out C). The fused attention keeps no [T,T] probabilities,
// so nothing grows with T per token; its backward's scratch is a bounded
// row block per backend, not per token. A block-input checkpoint is
// C * elem_bytes per token.
int64_t block_activation_bytes_per_token(const GptConfig& config, int64_t elem_bytes);

// Device buffers for block inputs kept off the device by the streamed GPT
// (models/gpt/session_gpt.cpp): backward computes from one while the next
// comes back into the other; the last two inputs of forward never leave them.
inline constexpr int64_t kOffloadedInputBuffers = 2;

// The device bytes the streamed GPT keeps beside its ops' workspace for a
// step of `grad_accum` micro-batches of batch x seq tokens, `pass` of them
// at once (the vertical order; 1 otherwise), elements of `elem_bytes`.
// models/gpt/session_gpt.cpp allocates exactly these, and the planner
// (engine/plan.cpp) counts them from here.
struct GptStepBuffers {
  uint64_t input = 0;  // one block input of one micro-batch: batch * seq * C elements
  // The kept block inputs of every micro-batch of the pass: all L + 1, or
  // the kOffloadedInputBuffers in flight when they are offloaded.
  uint64_t block_inputs = 0;
  // The gradient flowing down (dx, dx_in) per micro-batch of the pass, the
  // step's fp32 losses, the pass's int32 tokens and targets.
  uint64_t step = 0;
  // The embeddings' gradient of each micro-batch of the pass after the
  // first (the first's is the chunk store's).
  uint64_t embedding_gradients = 0;
  uint64_t total() const { return block_inputs + step + embedding_gradients; }
};
GptStepBuffers gpt_step_buffers(const GptConfig& config, int64_t elem_bytes, int64_t batch, int64_t seq, int64_t pass,
                                int64_t grad_accum, bool offload_inputs);

}  // namespace strata::gpt
