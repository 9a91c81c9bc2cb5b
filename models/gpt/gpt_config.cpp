#include "models/gpt/gpt_config.h"

#include <iterator>

#include "common/units.h"

namespace strata::gpt {

Status GptConfig::validate() const {
  auto bad = [](const std::string& m) { return invalid_argument("GPT config: " + m); };
  if (layers < 1 || layers > 4096) return bad("layers must be 1..4096, got " + std::to_string(layers));
  if (hidden < 1 || hidden > (1 << 20)) return bad("hidden must be 1..2^20, got " + std::to_string(hidden));
  if (heads < 1 || hidden % heads != 0) {
    return bad("heads must divide hidden (hidden " + std::to_string(hidden) + ", heads " + std::to_string(heads) + ")");
  }
  if (vocab < 2 || vocab > (1 << 24)) return bad("vocab must be 2..2^24, got " + std::to_string(vocab));
  if (max_seq < 1 || max_seq > (1 << 20)) return bad("max_seq must be 1..2^20, got " + std::to_string(max_seq));
  return ok_status();
}

GptConfig gpt2_config(const std::string& size) {
  GptConfig c;
  if (size == "medium") {
    c.layers = 24, c.hidden = 1024, c.heads = 16;
  } else if (size == "large") {
    c.layers = 36, c.hidden = 1280, c.heads = 20;
  } else if (size == "xl") {
    c.layers = 48, c.hidden = 1600, c.heads = 25;
  }
  return c;  // "small" and anything else: GPT-2 small
}

int64_t TensorSlot::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorSlot& ChunkLayout::at(const std::string& suffix) const {
  for (const TensorSlot& t : tensors) {
    if (t.name.size() >= suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return t;
    }
  }
  STRATA_CHECK_MSG(false, "no tensor named *%s in the chunk", suffix.c_str());
  return tensors.front();
}

namespace {
// Where a tensor of `numel` elements placed at `end` (the previous one's
// end) ends, padded: the next tensor's offset.
int64_t padded_end(int64_t end, int64_t numel) {
  return static_cast<int64_t>(round_up(static_cast<uint64_t>(end + numel), kTensorAlignElems));
}

void add(ChunkLayout& chunk, std::string name, std::vector<int64_t> shape) {
  TensorSlot t{std::move(name), std::move(shape), chunk.numel};
  chunk.param_count += t.numel();
  chunk.numel = padded_end(chunk.numel, t.numel());
  chunk.tensors.push_back(std::move(t));
}

// One block's tensors in GPT-2 order: the name after "h.<layer>.", and the
// shape in multiples of the hidden size C (cols 0: a vector of rows * C).
struct BlockTensor {
  const char* suffix;
  int64_t rows, cols;
};
constexpr BlockTensor kBlockTensors[] = {
    {"ln_1.weight", 1, 0},        {"ln_1.bias", 1, 0},        {"attn.c_attn.weight", 1, 3}, {"attn.c_attn.bias", 3, 0},
    {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 1, 0}, {"ln_2.weight", 1, 0},        {"ln_2.bias", 1, 0},
    {"mlp.c_fc.weight", 1, 4},    {"mlp.c_fc.bias", 4, 0},    {"mlp.c_proj.weight", 4, 1},  {"mlp.c_proj.bias", 1, 0}};
}  // namespace

ChunkLayout block_layout(const GptConfig& c, int64_t layer) {
  ChunkLayout chunk;
  chunk.kind = ChunkKind::kBlock;
  chunk.block = layer;
  const int64_t C = c.hidden;
  const std::string p = "h." + std::to_string(layer) + ".";
  for (const BlockTensor& t : kBlockTensors) {
    add(chunk, p + t.suffix, t.cols ? std::vector<int64_t>{t.rows * C, t.cols * C} : std::vector<int64_t>{t.rows * C});
  }
  return chunk;
}

EndOffsets end_offsets(const GptConfig& c) {
  const ChunkLayout emb = embedding_layout(c), fin = final_layout(c);
  return {emb.tensors[0].offset, emb.tensors[1].offset, fin.tensors[0].offset, fin.tensors[1].offset, fin.numel,
          block_layout(c, 0).numel};
}

// The offsets block_layout gives, from the same table without building the
// names and shapes: the kernels take them on every call.
BlockOffsets block_offsets(const GptConfig& c) {
  const int64_t C = c.hidden;
  int64_t at[std::size(kBlockTensors)];
  int64_t end = 0;
  for (size_t i = 0; i < std::size(kBlockTensors); ++i) {
    const BlockTensor& t = kBlockTensors[i];
    at[i] = end;
    end = padded_end(end, t.rows * C * (t.cols ? t.cols * C : 1));
  }
  static_assert(std::size(kBlockTensors) == 12);
  return {at[0], at[1], at[2], at[3], at[4], at[5], at[6], at[7], at[8], at[9], at[10], at[11]};
}

ChunkLayout embedding_layout(const GptConfig& c) {
  ChunkLayout chunk;
  chunk.kind = ChunkKind::kEmbedding;
  add(chunk, "wte.weight", {c.vocab, c.hidden});
  add(chunk, "wpe.weight", {c.max_seq, c.hidden});
  return chunk;
}

ChunkLayout final_layout(const GptConfig& c) {
  ChunkLayout chunk;
  chunk.kind = ChunkKind::kFinal;
  add(chunk, "ln_f.weight", {c.hidden});
  add(chunk, "ln_f.bias", {c.hidden});
  return chunk;
}

std::vector<ChunkLayout> model_layout(const GptConfig& c) {
  std::vector<ChunkLayout> out;
  out.push_back(embedding_layout(c));
  for (int64_t l = 0; l < c.layers; ++l) out.push_back(block_layout(c, l));
  out.push_back(final_layout(c));
  return out;
}

int64_t block_parameter_count(const GptConfig& c) { return 12 * c.hidden * c.hidden + 13 * c.hidden; }

int64_t parameter_count(const GptConfig& c) {
  return c.vocab * c.hidden + c.max_seq * c.hidden + c.layers * block_parameter_count(c) + 2 * c.hidden;
}

double forward_flops_per_token(const GptConfig& c, int64_t seq) {
  double C = static_cast<double>(c.hidden), L = static_cast<double>(c.layers);
  return 2.0 * (12.0 * C * C * L + static_cast<double>(c.vocab) * C) + 4.0 * L * static_cast<double>(seq) * C;
}

double training_flops_per_token(const GptConfig& c, int64_t seq, bool recompute) {
  return (recompute ? 4.0 : 3.0) * forward_flops_per_token(c, seq);
}

int64_t block_activation_bytes_per_token(const GptConfig& c, int64_t elem_bytes) {
  return 16 * c.hidden * elem_bytes + 4 * c.heads + 16;
}

GptStepBuffers gpt_step_buffers(const GptConfig& c, int64_t elem_bytes, int64_t batch, int64_t seq, int64_t pass,
                                int64_t grad_accum, bool offload_inputs) {
  GptStepBuffers b;
  const auto N = static_cast<uint64_t>(batch * seq), V = static_cast<uint64_t>(pass);
  b.input = N * static_cast<uint64_t>(c.hidden) * static_cast<uint64_t>(elem_bytes);
  const auto kept = static_cast<uint64_t>(offload_inputs ? kOffloadedInputBuffers : c.layers + 1);
  b.block_inputs = kept * V * b.input;
  b.step = 2 * V * b.input + static_cast<uint64_t>(grad_accum) * 4 + 2 * V * N * 4;
  b.embedding_gradients =
      (V - 1) * static_cast<uint64_t>(embedding_layout(c).numel) * static_cast<uint64_t>(elem_bytes);
  return b;
}

}  // namespace strata::gpt
