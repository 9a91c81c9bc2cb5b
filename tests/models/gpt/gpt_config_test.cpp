#include "models/gpt/gpt_config.h"

#include <gtest/gtest.h>

#include <iterator>
#include <set>

namespace strata::gpt {
namespace {

TEST(GptConfig, Gpt2SmallHasItsKnownParameterCount) {
  GptConfig c = gpt2_config("small");
  ASSERT_TRUE(c.validate().ok());
  EXPECT_EQ(parameter_count(c), 124439808);  // GPT-2 small (124M), tied output projection
  EXPECT_EQ(parameter_count(gpt2_config("xl")), 1557611200);
}

TEST(GptConfig, LayoutsFollowGpt2NamesShapesAndAlignment) {
  GptConfig c;
  c.layers = 3, c.hidden = 40, c.heads = 4, c.vocab = 101, c.max_seq = 17;
  ASSERT_TRUE(c.validate().ok());
  std::vector<ChunkLayout> chunks = model_layout(c);
  ASSERT_EQ(chunks.size(), 5u);
  EXPECT_EQ(chunks.front().tensors[0].name, "wte.weight");
  EXPECT_EQ(chunks.back().tensors[0].name, "ln_f.weight");
  int64_t total = 0;
  std::set<std::string> names;
  for (const ChunkLayout& chunk : chunks) {
    int64_t end = 0;
    for (const TensorSlot& t : chunk.tensors) {
      EXPECT_EQ(t.offset % kTensorAlignElems, 0) << t.name;
      EXPECT_GE(t.offset, end) << t.name << " overlaps the previous tensor";
      end = t.offset + t.numel();
      EXPECT_TRUE(names.insert(t.name).second) << "duplicate " << t.name;
    }
    EXPECT_LE(end, chunk.numel);
    EXPECT_EQ(chunk.numel % kTensorAlignElems, 0);
    total += chunk.param_count;
  }
  EXPECT_EQ(total, parameter_count(c));
  const ChunkLayout& b1 = chunks[2];
  EXPECT_EQ(b1.block, 1);
  EXPECT_EQ(b1.param_count, block_parameter_count(c));
  EXPECT_EQ(b1.at("attn.c_attn.weight").name, "h.1.attn.c_attn.weight");
  EXPECT_EQ(b1.at("attn.c_attn.weight").shape, (std::vector<int64_t>{40, 120}));
  EXPECT_EQ(b1.at("mlp.c_proj.weight").shape, (std::vector<int64_t>{160, 40}));
  // Every block has the same offsets.
  for (size_t i = 0; i < b1.tensors.size(); ++i) EXPECT_EQ(chunks[1].tensors[i].offset, b1.tensors[i].offset);
}

// block_offsets (what the kernels take per call, without the names) gives
// block_layout's offsets, for hidden sizes that do and do not pad.
TEST(GptConfig, BlockOffsetsAreTheLayoutsOffsets) {
  for (int64_t hidden : {8, 40, 64, 100, 768, 1600}) {
    GptConfig c;
    c.hidden = hidden, c.heads = 4;
    const ChunkLayout l = block_layout(c, 5);
    const BlockOffsets o = block_offsets(c);
    const int64_t got[] = {o.ln1w, o.ln1b, o.attnw, o.attnb, o.projw,   o.projb,
                           o.ln2w, o.ln2b, o.fcw,   o.fcb,   o.fcprojw, o.fcprojb};
    ASSERT_EQ(l.tensors.size(), std::size(got));
    for (size_t i = 0; i < l.tensors.size(); ++i)
      EXPECT_EQ(got[i], l.tensors[i].offset) << "hidden " << hidden << " " << l.tensors[i].name;
  }
}

TEST(GptConfig, FormulasMatchTheirDefinitions) {
  GptConfig c = gpt2_config("small");
  const double C = 768, L = 12, V = 50257, T = 1024;
  // Matmul weights per block: c_attn 3C^2, c_proj C^2, c_fc 4C^2, mlp c_proj 4C^2 = 12C^2.
  double fwd = 2 * (12 * C * C * L + V * C) + 4 * L * T * C;
  EXPECT_DOUBLE_EQ(forward_flops_per_token(c, 1024), fwd);
  EXPECT_DOUBLE_EQ(training_flops_per_token(c, 1024, false), 3 * fwd);
  EXPECT_DOUBLE_EQ(training_flops_per_token(c, 1024, true), 4 * fwd);
  EXPECT_EQ(block_activation_bytes_per_token(c, 2), 16 * 768 * 2 + 4 * 12 + 16);
}

TEST(GptConfig, BadConfigsAreRefusedWithTheField) {
  GptConfig c;
  c.heads = 7;  // 768 % 7 != 0
  Status s = c.validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("heads"), std::string::npos);
  GptConfig zero;
  zero.layers = 0;
  EXPECT_NE(zero.validate().message().find("layers"), std::string::npos);
}

}  // namespace
}  // namespace strata::gpt
