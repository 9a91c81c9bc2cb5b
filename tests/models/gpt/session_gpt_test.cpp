// The built-in GPT driven through the session API (SessionGpt) against the
// trainer's loss sequence recorded in tests/bindings/golden_losses.txt: the
// same config, seed and synthetic data give the same losses bit for bit
// through engine::Session's calls alone — resident, streamed with
// accumulation and clipping, fp16 with the states on NVMe, everything on
// NVMe. Run with OPENBLAS_CORETYPE=Haswell, as the recording was.
#include "models/gpt/session_gpt.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_optim/optimizer.h"
#include "engine/checkpoint_io.h"
#include "engine/session_config.h"
#include "models/gpt/gpt_init.h"
#include "models/gpt/trainer.h"
#include "models/gpt/trainer_config.h"
#include "tests/models/gpt/random_model.h"
#include "tests/test_util.h"

namespace strata::engine {
namespace {

constexpr int kSteps = 8;

// The golden runs' config (tests/bindings/golden_losses_test.c), as JSON.
nlohmann::json golden_config(int grad_accum, const char* precision, double clip) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"layers": 3, "hidden": 64, "heads": 2, "vocab": 96, "max_seq": 32},
    "budgets": {"device": "256MiB", "host": "1GiB"},
    "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01},
    "seed": 7, "pin_memory": false})");
  j["batch"] = {{"micro_batch", 2}, {"seq", 32}, {"grad_accum", grad_accum}};
  j["precision"] = precision;
  j["gradient_clipping"] = clip;
  return j;
}

// Run name -> its recorded losses.
std::map<std::string, std::vector<float>> golden() {
  std::ifstream in(STRATA_GOLDEN_LOSSES);
  std::map<std::string, std::vector<float>> runs;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, step, hex;
    fields >> name >> step >> hex;
    runs[name].push_back(std::strtof(hex.c_str(), nullptr));
  }
  return runs;
}

struct GoldenRun {
  const char* name;
  int grad_accum;
  const char* precision;
  double clip;
  nlohmann::json placement;
  bool offload;  // the block inputs handed to the session
};

// The trainer a config makes (as `strata train` makes it); the parsed
// config into *cfg.
Result<std::unique_ptr<Trainer>> trainer_of(const nlohmann::json& j, GptRunConfig* cfg) {
  std::vector<std::string> warnings;
  STRATA_ASSIGN_OR_RETURN(*cfg, parse_gpt_config(j, &warnings));
  STRATA_ASSIGN_OR_RETURN(TrainerOptions o, trainer_options(*cfg));
  return Trainer::create(o);
}

// A session made from the run's config, and the GPT registered with it.
struct Built {
  std::unique_ptr<Session> session;
  std::unique_ptr<SessionGpt> model;
};

Result<Built> build(const GoldenRun& r, const std::string& nvme, bool resident_first = true, int64_t per_pass = 1) {
  nlohmann::json j = golden_config(r.grad_accum, r.precision, r.clip);
  j["placement"] = r.placement;
  j["nvme_paths"] = {nvme};
  std::vector<std::string> warnings;
  STRATA_ASSIGN_OR_RETURN(GptRunConfig run, parse_gpt_config(j, &warnings));
  const EngineConfig& cfg = run.engine;
  STRATA_ASSIGN_OR_RETURN(SessionOptions o, session_options(cfg));
  o.resident_first = resident_first;
  Built b;
  STRATA_ASSIGN_OR_RETURN(b.session, Session::create(o));
  SessionGptOptions g;
  g.model = run.gpt.model;
  g.batch = cfg.setup.micro_batch;
  g.seq = run.gpt.seq;
  g.seed = cfg.seed;
  g.offload_activations = r.offload;
  g.micro_batches_per_pass = per_pass;
  STRATA_ASSIGN_OR_RETURN(b.model, SessionGpt::create(*b.session, g));
  return b;
}

// `steps` steps of the synthetic stream; the losses (fewer on a failure).
std::vector<float> steps(SessionGpt& m, int steps, const char* name) {
  std::vector<float> losses;
  for (int k = 0; k < steps; ++k) {
    Result<float> loss = m.step();
    EXPECT_TRUE(loss.has_value()) << name << " step " << k + 1 << ": " << loss.status().to_string();
    if (!loss.has_value()) return losses;
    losses.push_back(*loss);
  }
  return losses;
}

std::vector<float> train(const GoldenRun& r, const std::string& nvme, int64_t per_pass = 1) {
  Result<Built> b = build(r, nvme, true, per_pass);
  EXPECT_TRUE(b.has_value()) << b.status().to_string();
  if (!b.has_value()) return {};
  std::vector<float> losses = steps(*b->model, kSteps, r.name);
  EXPECT_TRUE(b->session->finalize().ok());
  return losses;
}

TEST(SessionGpt, ReproducesTheTrainersRecordedLossesBitForBit) {
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  if (core == nullptr || std::string(core) != "Haswell") {
    GTEST_SKIP() << "the recording's OpenBLAS kernels: run with OPENBLAS_CORETYPE=Haswell (ctest sets it)";
  }
  const std::map<std::string, std::vector<float>> want = golden();
  testing::TempDir dir;
  const std::vector<GoldenRun> runs = {
      {"bf16_resident", 1, "bf16", 0, {{"weights", "device"}, {"states", "host"}}, false},
      {"bf16_streamed_accum2",
       2,
       "bf16",
       0.5,
       {{"weights", "host"}, {"states", "host"}, {"activations", "host"}},
       true},
      {"fp16_states_nvme", 1, "fp16", 1.0, {{"weights", "host"}, {"states", "nvme"}}, false},
      {"bf16_all_nvme_accum2", 2, "bf16", 0, {{"weights", "nvme"}, {"states", "nvme"}, {"activations", "nvme"}}, true},
  };
  for (const GoldenRun& r : runs) {
    SCOPED_TRACE(r.name);
    ASSERT_EQ(want.count(r.name), 1u) << "no recorded run " << r.name << " in " << STRATA_GOLDEN_LOSSES;
    const std::vector<float>& expected = want.at(r.name);
    ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));
    // One micro-batch after another, and (accumulating) all of a step's
    // together in the vertical order.
    for (int64_t per_pass : r.grad_accum > 1 ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{1}) {
      SCOPED_TRACE(per_pass == 1 ? "one micro-batch at a time" : "the vertical order");
      const std::vector<float> got =
          train(r, dir.sub(r.name + std::string(per_pass == 1 ? "" : "-vertical")), per_pass);
      ASSERT_EQ(got.size(), expected.size());
      for (int k = 0; k < kSteps; ++k) {
        EXPECT_EQ(std::bit_cast<uint32_t>(got[k]), std::bit_cast<uint32_t>(expected[k]))
            << "step " << k + 1 << ": " << got[k] << " (" << std::hexfloat << got[k] << "), recorded " << expected[k];
      }
      EXPECT_LT(got.back(), got.front()) << "the loss falls";
    }
  }
}

const GoldenRun kAllNvme = {
    "bf16_all_nvme_accum2", 2, "bf16", 0, {{"weights", "nvme"}, {"states", "nvme"}, {"activations", "nvme"}}, true};

// The session's checkpoint of the GPT (weights, master weights and states
// streamed from NVMe) resumes the run bit for bit.
TEST(SessionGpt, ResumesFromTheSessionsCheckpointBitForBit) {
  testing::TempDir dir;
  Result<Built> straight = build(kAllNvme, dir.sub("straight"));
  ASSERT_TRUE(straight.has_value()) << straight.status().to_string();
  const std::vector<float> want = steps(*straight->model, 6, "straight");
  ASSERT_EQ(want.size(), 6u);

  std::vector<float> got;
  {
    Result<Built> first = build(kAllNvme, dir.sub("first"));
    ASSERT_TRUE(first.has_value()) << first.status().to_string();
    got = steps(*first->model, 3, "first");
    ASSERT_TRUE(first->session->save(dir.sub("ckpt")).ok());
  }
  // Loaded before its first step: the chunks are placed without drawing
  // GPT-2's initial weights or writing initial states, so NVMe holds only
  // what the load wrote (as much as the first run's start wrote, less
  // nothing drawn).
  Result<Built> resumed = build(kAllNvme, dir.sub("resumed"));
  ASSERT_TRUE(resumed.has_value()) << resumed.status().to_string();
  EXPECT_FALSE(resumed->session->started());
  Status loaded = resumed->session->load(dir.path() + "/ckpt");
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
  ASSERT_EQ(resumed->session->steps_done(), 3);
  Result<Built> fresh = build(kAllNvme, dir.sub("fresh"));
  ASSERT_TRUE(fresh.has_value() && fresh->session->start().ok());
  EXPECT_EQ(resumed->session->counters().nvme_written_bytes, fresh->session->counters().nvme_written_bytes)
      << "the load should write each state once, as a start does, and nothing before it";
  for (float l : steps(*resumed->model, 3, "resumed")) got.push_back(l);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(std::bit_cast<uint32_t>(got[k]), std::bit_cast<uint32_t>(want[k])) << "step " << k + 1;
  }
}

// Bad input is an error that changes nothing: the next step is the one
// the run would have taken.
TEST(SessionGpt, RefusesBadInputWithNothingChanged) {
  testing::TempDir dir;
  Result<Built> no_resident = build(kAllNvme, dir.sub("a"), /*resident_first=*/false);
  ASSERT_FALSE(no_resident.has_value());
  EXPECT_EQ(no_resident.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_resident.status().to_string().find("resident_first"), std::string::npos)
      << no_resident.status().to_string();

  Result<Built> straight = build(kAllNvme, dir.sub("b"));
  ASSERT_TRUE(straight.has_value()) << straight.status().to_string();
  const std::vector<float> want = steps(*straight->model, 2, "straight");

  Result<Built> b = build(kAllNvme, dir.sub("c"));
  ASSERT_TRUE(b.has_value()) << b.status().to_string();
  const size_t n = 2 * 2 * 32;  // grad_accum x batch x seq
  std::vector<int32_t> tokens(n, 1), targets(n, 2);
  Result<float> short_batch = b->model->step(std::span(tokens).first(n - 1), targets);
  EXPECT_EQ(short_batch.status().code(), StatusCode::kInvalidArgument);
  tokens[5] = 96;  // the vocabulary is 0..95
  Result<float> outside = b->model->step(tokens, targets);
  EXPECT_EQ(outside.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(outside.status().to_string().find("vocabulary"), std::string::npos) << outside.status().to_string();
  EXPECT_EQ(b->session->steps_done(), 0);
  EXPECT_FALSE(b->session->in_step());
  const std::vector<float> got = steps(*b->model, 2, "after the refusals");
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(std::bit_cast<uint32_t>(got[k]), std::bit_cast<uint32_t>(want[k])) << "step " << k + 1;
  }
}

// The session's checkpoint of the GPT holds GPT-2's tensors under their
// names, with the bytes the trainer's own checkpoint holds after the same
// steps.
TEST(SessionGpt, CheckpointsHoldTheTrainersTensors) {
  testing::TempDir dir;
  const GoldenRun run = {"bf16_resident", 1, "bf16", 0, {{"weights", "host"}, {"states", "host"}}, false};
  Result<Built> b = build(run, dir.sub("nvme"));
  ASSERT_TRUE(b.has_value()) << b.status().to_string();
  ASSERT_EQ(steps(*b->model, 3, run.name).size(), 3u);
  ASSERT_TRUE(b->session->save(dir.sub("session")).ok());

  GptRunConfig cfg;
  Result<std::unique_ptr<Trainer>> t = trainer_of(golden_config(1, "bf16", 0), &cfg);
  ASSERT_TRUE(t.has_value()) << t.status().to_string();
  for (int k = 0; k < 3; ++k) ASSERT_TRUE((*t)->step().has_value());
  ASSERT_TRUE((*t)->save(dir.sub("trainer")).ok());

  Result<SafetensorsReader> mine = SafetensorsReader::open(dir.path() + "/session/step-3/model.safetensors");
  Result<SafetensorsReader> theirs = SafetensorsReader::open(dir.path() + "/trainer/step-3/model.safetensors");
  ASSERT_TRUE(mine.has_value()) << mine.status().to_string();
  ASSERT_TRUE(theirs.has_value()) << theirs.status().to_string();
  ASSERT_EQ(mine->tensors().size(), theirs->tensors().size());
  ASSERT_NE(mine->find("h.0.attn.c_attn.weight"), nullptr) << "GPT-2's names";
  for (const TensorInfo& want : theirs->tensors()) {
    const TensorInfo* got = mine->find(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->shape, want.shape) << want.name;
    std::vector<std::byte> a(want.bytes()), c(want.bytes());
    ASSERT_TRUE(mine->read(want.name, a).ok());
    ASSERT_TRUE(theirs->read(want.name, c).ok());
    EXPECT_TRUE(a == c) << want.name << ": the bytes differ";
  }
}

// The run's config with `extra` keys, through the trainer and through the
// session: the same losses bit for bit (and some steps clipped).
void expect_the_trainers_losses(const GoldenRun& r, const nlohmann::json& extra, const testing::TempDir& dir) {
  SCOPED_TRACE(r.name);
  nlohmann::json j = golden_config(r.grad_accum, r.precision, r.clip);
  j["placement"] = r.placement;
  j["nvme_paths"] = {dir.sub(std::string(r.name) + "-trainer")};
  j.update(extra);
  GptRunConfig config;
  Result<std::unique_ptr<Trainer>> t = trainer_of(j, &config);
  ASSERT_TRUE(t.has_value()) << t.status().to_string();
  const EngineConfig* cfg = &config.engine;
  std::vector<std::string> unhonoured;
  Result<SessionOptions> so = session_options(*cfg, &unhonoured);
  ASSERT_TRUE(so.has_value()) << so.status().to_string();
  EXPECT_TRUE(unhonoured.empty()) << unhonoured.front();
  so->nvme_paths = {dir.sub(std::string(r.name) + "-session")};
  so->resident_first = true;
  Result<std::unique_ptr<Session>> s = Session::create(*so);
  ASSERT_TRUE(s.has_value()) << s.status().to_string();
  SessionGptOptions g;
  g.model = config.gpt.model;
  g.batch = cfg->setup.micro_batch;
  g.seq = config.gpt.seq;
  g.seed = cfg->seed;
  g.offload_activations = r.offload;
  Result<std::unique_ptr<SessionGpt>> m = SessionGpt::create(**s, g);
  ASSERT_TRUE(m.has_value()) << m.status().to_string();
  const std::vector<float> got = steps(**m, kSteps, r.name);
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps));
  int clipped = 0;
  for (int k = 0; k < kSteps; ++k) {
    Result<float> want = (*t)->step();
    ASSERT_TRUE(want.has_value()) << want.status().to_string();
    EXPECT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(k)]), std::bit_cast<uint32_t>(*want))
        << "step " << k + 1 << ": session " << got[static_cast<size_t>(k)] << ", trainer " << *want;
    clipped += (*t)->last_clipped() ? 1 : 0;
  }
  EXPECT_GT(clipped, 0) << "the runs should clip some steps";
  EXPECT_TRUE((*s)->finalize().ok());
}

// The delayed update (opt-in, one step stale) through the session is the
// trainer's delayed update: the same losses bit for bit, accumulating and
// clipping, with the states in RAM and everything on NVMe.
TEST(SessionGpt, TheDelayedUpdateIsTheTrainersBitForBit) {
  testing::TempDir dir;
  const nlohmann::json delayed = {{"delayed_update", true}};
  expect_the_trainers_losses(
      {"delayed_host", 2, "bf16", 0.5, {{"weights", "host"}, {"states", "host"}, {"activations", "host"}}, true},
      delayed, dir);
  expect_the_trainers_losses(
      {"delayed_nvme", 2, "bf16", 0.5, {{"weights", "nvme"}, {"states", "nvme"}, {"activations", "nvme"}}, true},
      delayed, dir);
}

// A learning-rate schedule (warmup, then a cosine decay) through the
// session follows the trainer's rates: the same losses bit for bit, the
// gradients on NVMe in the session's ring too.
TEST(SessionGpt, TheScheduleAndGradientsOnNvmeAreTheTrainers) {
  testing::TempDir dir;
  const nlohmann::json schedule = {
      {"schedule",
       {{"warmup_steps", 3}, {"start_lr", 0.0005}, {"decay", "cosine"}, {"decay_end_step", 7}, {"end_lr", 0.0002}}}};
  expect_the_trainers_losses(
      {"schedule_host", 1, "bf16", 0.5, {{"weights", "host"}, {"states", "host"}, {"activations", "host"}}, true},
      schedule, dir);
  nlohmann::json ring = schedule;
  ring["placement"] = {{"weights", "host"}, {"states", "nvme"}, {"gradients", "nvme"}, {"activations", "host"}};
  expect_the_trainers_losses({"schedule_grads_nvme", 1, "bf16", 0.5, {}, true}, ring, dir);
}

// fp32 working weights: the GPT through the session computes with its
// master weights' own bits, so its first step is the fp32 reference model
// (HostGpt: every activation kept, nothing recomputed) exactly — the same
// loss, and master weights after the update equal to the optimizer's step
// on the reference's gradients — with the weights and states in RAM and
// with everything on NVMe through a device a fraction of the model.
TEST(SessionGpt, Fp32WorkingWeightsMatchTheReferenceModelExactly) {
  gpt::GptConfig c;
  c.layers = 3, c.hidden = 32, c.heads = 2, c.vocab = 40, c.max_seq = 16;
  const int64_t B = 2, T = 16;
  const uint64_t seed = 11;
  const std::vector<gpt::ChunkLayout> layout = gpt::model_layout(c);
  Result<std::unique_ptr<cpu_optim::Executor>> ex = cpu_optim::Executor::create();
  ASSERT_TRUE(ex.has_value());
  std::vector<std::vector<float>> w;
  for (size_t k = 0; k < layout.size(); ++k) {
    w.emplace_back(static_cast<size_t>(layout[k].numel));
    initial_master(layout[k], k, seed, c.layers, **ex, w.back().data());
  }
  std::vector<int32_t> tokens, targets;
  synthetic_batch(seed, c.vocab, B, T, 0, &tokens, &targets);
  std::vector<std::vector<float>> g;
  const float ref_loss = gpt::testing::reference_step(c, B, T, w, tokens, targets, 1.0f, &g);
  cpu_optim::AdamConfig adam;
  adam.lr = 1e-3;
  adam.weight_decay = 0.01;
  adam.decoupled_weight_decay = true;
  std::vector<std::vector<float>> want = w;  // the reference's update
  for (size_t k = 0; k < layout.size(); ++k) {
    std::vector<float> m(want[k].size(), 0.0f), v(want[k].size(), 0.0f);
    cpu_optim::ParamSpan span;
    span.params = want[k].data();
    span.n = static_cast<int64_t>(want[k].size());
    span.grad = g[k].data();
    span.grad_dtype = DType::kF32;
    span.state = {cpu_optim::StateType::kF32, m.data(), v.data()};
    ASSERT_TRUE(cpu_optim::step(adam, 1, span, {}, **ex).has_value());
  }

  testing::TempDir dir;
  uint64_t model_bytes = 0;
  for (const gpt::ChunkLayout& l : layout) model_bytes += static_cast<uint64_t>(l.numel) * 16;
  for (bool on_nvme : {false, true}) {
    SCOPED_TRACE(on_nvme ? "everything on NVMe" : "in RAM");
    SessionOptions o;
    o.precision = DType::kF32;
    o.adam = adam;
    o.resident_first = true;
    o.pin_memory = false;
    if (on_nvme) {
      o.states = Tier::kNvme;
      o.activations = Tier::kNvme;
      o.nvme_paths = {dir.sub(on_nvme ? "nvme" : "ram")};
    }
    Result<std::unique_ptr<Session>> s = Session::create(o);
    ASSERT_TRUE(s.has_value()) << s.status().to_string();
    SessionGptOptions go;
    go.model = c;
    go.batch = B;
    go.seq = T;
    go.seed = seed;
    go.offload_activations = on_nvme;
    Result<std::unique_ptr<SessionGpt>> m = SessionGpt::create(**s, go);
    ASSERT_TRUE(m.has_value()) << m.status().to_string();
    Result<float> loss = (*m)->step();
    ASSERT_TRUE(loss.has_value()) << loss.status().to_string();
    EXPECT_EQ(std::bit_cast<uint32_t>(*loss), std::bit_cast<uint32_t>(ref_loss)) << *loss << " vs " << ref_loss;
    for (size_t k = 0; k < layout.size(); ++k) {
      std::vector<float> got(want[k].size());
      ASSERT_TRUE((*s)->read_master(k, got).ok());
      EXPECT_EQ(std::memcmp(got.data(), want[k].data(), got.size() * 4), 0) << "chunk " << k << "'s master weights";
    }
    EXPECT_LT((*s)->counters().device_peak_bytes, model_bytes) << "the device held less than the model states";
  }
}

// The vertical order acquires each block once for all of a step's
// micro-batches: streamed from NVMe, its weights cross to the device once
// a step instead of once a micro-batch.
TEST(SessionGpt, TheVerticalOrderMovesTheWeightsOncePerStep) {
  testing::TempDir dir;
  GoldenRun four = kAllNvme;
  four.grad_accum = 4;
  uint64_t h2d[2] = {0, 0};
  for (int64_t per_pass : {1, 0}) {
    Result<Built> b = build(four, dir.sub(per_pass == 1 ? "one" : "all"), true, per_pass);
    ASSERT_TRUE(b.has_value()) << b.status().to_string();
    ASSERT_EQ(steps(*b->model, 2, "warm-up").size(), 2u);
    const uint64_t before = b->session->counters().h2d_bytes;
    ASSERT_EQ(steps(*b->model, 1, "measured").size(), 1u);
    h2d[per_pass == 1 ? 0 : 1] = b->session->counters().h2d_bytes - before;
  }
  std::printf("bytes to the device in a step of 4 micro-batches: %llu one at a time, %llu vertical\n",
              static_cast<unsigned long long>(h2d[0]), static_cast<unsigned long long>(h2d[1]));
  EXPECT_GT(h2d[1], 0u);
  EXPECT_LT(2 * h2d[1], h2d[0]) << "one at a time: " << h2d[0] << " bytes; vertical: " << h2d[1];
}

TEST(SessionGpt, APassThatDoesNotDivideTheStepIsRefused) {
  testing::TempDir dir;
  Result<Built> b = build(kAllNvme, dir.sub("a"), true, 3);  // grad_accum 2
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().to_string().find("micro_batches_per_pass"), std::string::npos) << b.status().to_string();
}

}  // namespace
}  // namespace strata::engine
