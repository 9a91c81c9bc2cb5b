// The built-in corpus of `strata train --data arithmetic`: additions of two
// d-digit numbers written as bytes, "123+456=0579\n" (operands zero-padded
// to d digits, the sum to d + 1, so every example is 3d + 4 bytes and the
// corpus is addressable by position). Deterministic, generated on the fly,
// learnable by a small model, with a held-out split: the pairs (a, b) whose
// hash falls in one bucket of kHeldOutBuckets never appear in training, and
// the accuracy is measured on them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::engine {
class Trainer;
}
namespace strata::gpt {
struct GptConfig;
}

namespace strata::tools {

class ArithmeticData {
 public:
  static constexpr int kHeldOutBuckets = 10;
  // digits: 1..6. InvalidArgument for a vocabulary too small for the
  // characters ("0-9+=\n" as bytes: at least 62) or a bad digit count.
  static Result<ArithmeticData> create(int digits, uint64_t seed, int64_t vocab);

  int digits() const { return digits_; }
  int64_t example_bytes() const { return 3 * digits_ + 4; }
  // Training example k's text (a pair outside the held-out bucket).
  std::string train_example(int64_t k) const;
  // Held-out example k's text.
  std::string held_out_example(int64_t k) const;
  // Micro-batch `index` as TokenFile's: row b is the window of seq + 1
  // bytes of the training stream (its examples back to back) starting at
  // (index * batch + b) * seq; the first seq are the tokens, the last seq
  // the targets.
  void micro_batch(int64_t index, int64_t batch, int64_t seq, std::span<int32_t> tokens,
                   std::span<int32_t> targets) const;
  // Where the answer of an example starts: the byte after '='.
  int64_t answer_offset() const { return 2 * digits_ + 2; }

 private:
  ArithmeticData(int digits, uint64_t seed) : digits_(digits), seed_(seed) {}
  // The k-th pair (a, b) whose bucket is (held_out ? the held-out one : any other).
  std::pair<int64_t, int64_t> pair(int64_t k, bool held_out) const;
  bool is_held_out(int64_t a, int64_t b) const;
  std::string text(int64_t a, int64_t b) const;

  int digits_;
  uint64_t seed_;
};

// Exact-match accuracy of `trainer`'s model on the first n held-out
// examples: the fraction whose greedy answer after "a+b=" is the sum, every
// digit. Evaluated on the CPU from the fp32 master weights, with the true
// prefix at each position (all argmaxes right is greedy decoding right).
// InvalidArgument when an example is longer than the model's max_seq.
Result<double> held_out_accuracy(engine::Trainer& trainer, const gpt::GptConfig& model, const ArithmeticData& data,
                                 int64_t n);

}  // namespace strata::tools
