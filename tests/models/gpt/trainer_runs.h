// What the trainer tests share: a tiny GPT's options and a run's record,
// step by step.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/gpt/trainer.h"

namespace strata::engine::testing {

// 2 blocks of hidden 32, vocabulary 64, 4 x 16 tokens a micro-batch.
inline TrainerOptions tiny(uint64_t seed) {
  TrainerOptions o;
  o.model.layers = 2, o.model.hidden = 32, o.model.heads = 4, o.model.vocab = 64, o.model.max_seq = 16;
  o.batch = 4;
  o.seq = 16;
  o.seed = seed;
  o.adam.lr = 1e-2f;
  o.adam.weight_decay = 0.01f;
  return o;
}

// What a run of `steps` steps did, step by step.
struct RunLog {
  std::vector<float> losses;
  std::vector<double> norms;
  std::vector<double> scales;  // the loss scale each step used (fp16)
  int clipped = 0;
  int skipped = 0;
  int64_t rollbacks = 0;
  int64_t updates = 0;        // updates_done() at the end
  uint64_t host_bytes = 0;    // the trainer's host memory (host_bytes())
  uint64_t nvme_written = 0;  // NVMe bytes the last step wrote
};

inline RunLog run_log(const TrainerOptions& o, int steps) {
  RunLog r;
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  EXPECT_TRUE(tr) << tr.error().to_string();
  if (tr) r.host_bytes = (*tr)->host_bytes();
  for (int i = 0; i < steps && tr; ++i) {
    r.scales.push_back((*tr)->loss_scale());
    Result<float> loss = (*tr)->step();
    EXPECT_TRUE(loss) << "step " << i + 1 << ": " << loss.error().to_string();
    if (!loss) break;
    r.losses.push_back(*loss);
    r.norms.push_back((*tr)->last_grad_norm());
    r.clipped += (*tr)->last_clipped() ? 1 : 0;
    r.skipped += (*tr)->last_skipped() ? 1 : 0;
    r.nvme_written = (*tr)->last_counters().nvme_written_bytes;
  }
  if (tr) r.rollbacks = (*tr)->rollbacks();
  if (tr) r.updates = (*tr)->updates_done();
  return r;
}

// The losses of a run of `steps` steps.
inline std::vector<float> run(const TrainerOptions& o, int steps) { return run_log(o, steps).losses; }

// Every file under `root` (relative path -> bytes).
inline std::map<std::string, std::string> files_under(const std::string& root) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    files[std::filesystem::relative(e.path(), root).string()] =
        std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return files;
}

}  // namespace strata::engine::testing
