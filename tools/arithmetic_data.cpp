#include "tools/arithmetic_data.h"

#include <cstdio>

#include "models/gpt/gpt_config.h"
#include "models/gpt/host/gpt.h"
#include "models/gpt/gpt_init.h"
#include "models/gpt/trainer.h"

namespace strata::tools {
namespace {

using engine::mix64;

int64_t power10(int d) {
  int64_t p = 1;
  for (int i = 0; i < d; ++i) p *= 10;
  return p;
}

}  // namespace

Result<ArithmeticData> ArithmeticData::create(int digits, uint64_t seed, int64_t vocab) {
  if (digits < 1 || digits > 6) {
    return invalid_argument("arithmetic data: digits must be 1..6, got " + std::to_string(digits));
  }
  if (vocab < '=' + 1) {
    return invalid_argument("arithmetic data: the vocabulary must hold the bytes of \"0-9+=\\n\" (at least " +
                            std::to_string('=' + 1) + "), got " + std::to_string(vocab));
  }
  return ArithmeticData(digits, seed);
}

bool ArithmeticData::is_held_out(int64_t a, int64_t b) const {
  const uint64_t h = mix64(mix64(seed_ ^ 0x5bd1e995u) ^ static_cast<uint64_t>(a * power10(digits_) + b));
  return h % kHeldOutBuckets == 0;
}

std::pair<int64_t, int64_t> ArithmeticData::pair(int64_t k, bool held_out) const {
  const auto n = static_cast<uint64_t>(power10(digits_));
  // Draws until the pair lands on the wanted side of the split: 1.1 draws
  // on average for training, 10 for held-out.
  for (uint64_t attempt = 0;; ++attempt) {
    const uint64_t h = mix64(seed_ * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(k) * 64 + attempt +
                             (held_out ? 0x8000000000000000ull : 0));
    const auto a = static_cast<int64_t>((h >> 32) % n), b = static_cast<int64_t>((h & 0xffffffffu) % n);
    if (is_held_out(a, b) == held_out) return {a, b};
  }
}

std::string ArithmeticData::text(int64_t a, int64_t b) const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*lld+%0*lld=%0*lld\n", digits_, static_cast<long long>(a), digits_,
                static_cast<long long>(b), digits_ + 1, static_cast<long long>(a + b));
  return buf;
}

std::string ArithmeticData::train_example(int64_t k) const {
  const auto [a, b] = pair(k, false);
  return text(a, b);
}

std::string ArithmeticData::held_out_example(int64_t k) const {
  const auto [a, b] = pair(k, true);
  return text(a, b);
}

void ArithmeticData::micro_batch(int64_t index, int64_t batch, int64_t seq, std::span<int32_t> tokens,
                                 std::span<int32_t> targets) const {
  const int64_t L = example_bytes();
  std::string ex;
  int64_t ex_index = -1;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = (index * batch + b) * seq;
    for (int64_t t = 0; t <= seq; ++t) {
      const int64_t p = start + t;
      if (p / L != ex_index) {
        ex_index = p / L;
        ex = train_example(ex_index);
      }
      const auto byte = static_cast<int32_t>(static_cast<unsigned char>(ex[static_cast<size_t>(p % L)]));
      if (t < seq) tokens[static_cast<size_t>(b * seq + t)] = byte;
      if (t > 0) targets[static_cast<size_t>(b * seq + t - 1)] = byte;
    }
  }
}

Result<double> held_out_accuracy(engine::Trainer& trainer, const gpt::GptConfig& model, const ArithmeticData& data,
                                 int64_t n) {
  const int64_t T = data.example_bytes() - 1;
  if (T > model.max_seq) {
    return invalid_argument("held-out accuracy: an example is " + std::to_string(T) +
                            " tokens, the model's max_seq " + std::to_string(model.max_seq));
  }
  if (n < 1) return invalid_argument("held-out accuracy: needs at least one example");
  const std::vector<gpt::ChunkLayout> layout = gpt::model_layout(model);
  std::vector<std::vector<float>> chunks(layout.size());
  gpt::host::ModelParams<float> params;
  for (size_t c = 0; c < layout.size(); ++c) {
    chunks[c].resize(static_cast<size_t>(layout[c].numel));
    STRATA_RETURN_IF_ERROR(trainer.read_master(c, chunks[c].data()));
    params.chunks.push_back(chunks[c].data());
  }
  std::vector<int32_t> tokens(static_cast<size_t>(n * T)), targets(tokens.size()), predicted(tokens.size());
  for (int64_t k = 0; k < n; ++k) {
    const std::string ex = data.held_out_example(k);
    for (int64_t t = 0; t < T; ++t) {
      tokens[static_cast<size_t>(k * T + t)] = static_cast<unsigned char>(ex[static_cast<size_t>(t)]);
      targets[static_cast<size_t>(k * T + t)] = static_cast<unsigned char>(ex[static_cast<size_t>(t + 1)]);
    }
  }
  gpt::host::HostGpt<float> gpt(model, n, T);
  gpt.forward(params, tokens.data(), targets.data());
  gpt.predict(params, predicted.data());
  // The answer's digits are the targets at positions answer_offset - 1 on.
  int64_t right = 0;
  for (int64_t k = 0; k < n; ++k) {
    bool all = true;
    for (int64_t t = data.answer_offset() - 1; t < data.answer_offset() + data.digits(); ++t) {
      all = all && predicted[static_cast<size_t>(k * T + t)] == targets[static_cast<size_t>(k * T + t)];
    }
    right += all ? 1 : 0;
  }
  return static_cast<double>(right) / static_cast<double>(n);
}

}  // namespace strata::tools
