// strata-sessionbench: the built-in GPT on the session (SessionGpt, the way
// a user's model drives the engine) against the GPT's own trainer, the
// baseline, timed step by step in the same run, interleaved (round r starts
// with the one r mod 2), on the host backend in three placements: resident,
// streamed with the block inputs on the host, and weights, states and block
// inputs on NVMe. Prints each median step time, their ratio (session /
// trainer: above 1 the session path is slower) and whether the two gave
// the same losses, bit for bit, step by step (exits 1 where they did not).
#include <CLI/CLI.hpp>
#include <bit>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "models/gpt/session_gpt.h"
#include "models/gpt/trainer.h"

namespace {

using namespace strata;
using engine::Tier;

struct Placement {
  std::string name;
  bool stream = false;
  Tier states = Tier::kHost, weights = Tier::kHost, inputs = Tier::kDevice;
};

struct Flags {
  int64_t layers = 8, hidden = 256, heads = 4, vocab = 512, seq = 128, batch = 4;
  int reps = 5;
  std::string nvme = "/tmp";
};

engine::TrainerOptions trainer_options(const Flags& f, const Placement& p, const std::string& dir) {
  engine::TrainerOptions o;
  o.model.layers = f.layers, o.model.hidden = f.hidden, o.model.heads = f.heads, o.model.vocab = f.vocab;
  o.model.max_seq = f.seq;
  o.batch = f.batch, o.seq = f.seq, o.seed = 3;
  o.adam.lr = 1e-3;
  o.stream_weights = p.stream;
  o.prefetch_depth = 2;
  o.states = p.states;
  o.weights = p.weights;
  o.activations = p.inputs;
  o.pin_memory = false;
  if (p.states == Tier::kNvme || p.inputs == Tier::kNvme) o.nvme_paths = {dir};
  return o;
}

struct SessionRun {
  std::unique_ptr<engine::Session> session;
  std::unique_ptr<engine::SessionGpt> model;
};

Result<SessionRun> session_run(const Flags& f, const Placement& p, const std::string& dir) {
  const engine::TrainerOptions t = trainer_options(f, p, dir);
  engine::SessionOptions o;
  o.adam = t.adam;
  // Resident: a slot for every chunk (the embeddings have their own).
  o.prefetch_depth = p.stream ? t.prefetch_depth : static_cast<int>(f.layers);
  o.resident_first = true;
  o.states = p.states;
  o.weights = p.weights == Tier::kNvme ? Tier::kNvme : Tier::kHost;
  o.activations = p.inputs == Tier::kNvme ? Tier::kNvme : Tier::kHost;
  o.pin_memory = false;
  if (p.states == Tier::kNvme || p.inputs == Tier::kNvme) o.nvme_paths = {dir};
  SessionRun r;
  STRATA_ASSIGN_OR_RETURN(r.session, engine::Session::create(o));
  engine::SessionGptOptions g;
  g.model = t.model;
  g.batch = t.batch;
  g.seq = t.seq;
  g.seed = t.seed;
  g.offload_activations = p.inputs != Tier::kDevice;
  STRATA_ASSIGN_OR_RETURN(r.model, engine::SessionGpt::create(*r.session, g));
  // Initialised before the timing, as the trainer is at create.
  STRATA_RETURN_IF_ERROR(r.session->start());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata-sessionbench: the GPT on the session against its own trainer"};
  Flags f;
  app.add_option("--layers", f.layers, "blocks")->check(CLI::Range(2, 256));
  app.add_option("--hidden", f.hidden, "width")->check(CLI::Range(16, 8192));
  app.add_option("--heads", f.heads, "attention heads")->check(CLI::Range(1, 128));
  app.add_option("--seq", f.seq, "tokens per sequence")->check(CLI::Range(2, 4096));
  app.add_option("--batch", f.batch, "sequences per step")->check(CLI::Range(1, 1024));
  app.add_option("--reps", f.reps, "timed steps of each")->check(CLI::Range(1, 1000));
  app.add_option("--nvme", f.nvme, "directory for the NVMe placement (O_DIRECT)");
  CLI11_PARSE(app, argc, argv);
  const std::vector<Placement> placements = {
      {"resident", false, Tier::kHost, Tier::kHost, Tier::kDevice},
      {"streamed, inputs on host", true, Tier::kHost, Tier::kHost, Tier::kHost},
      {"all on NVMe", true, Tier::kNvme, Tier::kNvme, Tier::kNvme},
  };
  const nlohmann::json system = bench::system_info();
  std::printf("strata-sessionbench on %s (%d cores), GPT %lld layers x %lld, batch %lld x %lld, %d steps each\n",
              system["cpu"].get<std::string>().c_str(), system["cores"].get<int>(), static_cast<long long>(f.layers),
              static_cast<long long>(f.hidden), static_cast<long long>(f.batch), static_cast<long long>(f.seq), f.reps);
  std::printf("%-26s %12s %12s %8s  %s\n", "placement", "trainer ms", "session ms", "ratio", "same losses");
  nlohmann::json rows = nlohmann::json::array();
  bool all_same = true;
  for (const Placement& p : placements) {
    const std::string dir = f.nvme + "/strata-sessionbench";
    const std::string tdir = dir + "/trainer", sdir = dir + "/session";
    std::filesystem::create_directories(tdir);
    std::filesystem::create_directories(sdir);
    Result<std::unique_ptr<engine::Trainer>> trainer = engine::Trainer::create(trainer_options(f, p, tdir));
    bench::exit_on_error(trainer.status(), "strata-sessionbench: the trainer");
    Result<SessionRun> session = session_run(f, p, sdir);
    bench::exit_on_error(session.status(), "strata-sessionbench: the session");
    std::vector<float> trainer_losses, session_losses;
    auto trainer_step = [&] {
      Result<float> l = (*trainer)->step();
      bench::exit_on_error(l.status(), "strata-sessionbench: a trainer step");
      trainer_losses.push_back(*l);
    };
    auto session_step = [&] {
      Result<float> l = session->model->step();
      bench::exit_on_error(l.status(), "strata-sessionbench: a session step");
      session_losses.push_back(*l);
    };
    const std::vector<double> s = bench::interleaved_median_seconds(f.reps, {trainer_step, session_step});
    bool same = trainer_losses.size() == session_losses.size();
    for (size_t k = 0; same && k < trainer_losses.size(); ++k) {
      same = std::bit_cast<uint32_t>(trainer_losses[k]) == std::bit_cast<uint32_t>(session_losses[k]);
    }
    all_same = all_same && same;
    std::printf("%-26s %12.1f %12.1f %8.3f  %s\n", p.name.c_str(), s[0] * 1e3, s[1] * 1e3, s[1] / s[0],
                same ? "yes" : "NO");
    trainer->reset();
    session->model.reset();
    session->session.reset();
    std::filesystem::remove_all(dir);
    rows.push_back({{"placement", p.name},
                    {"trainer_seconds", s[0]},
                    {"session_seconds", s[1]},
                    {"ratio", s[1] / s[0]},
                    {"same_losses", same}});
  }
  nlohmann::json out = {
      {"benchmark", "sessionbench"}, {"system", system}, {"rows", rows}, {"all_same_losses", all_same}};
  std::printf("%s\n", out.dump().c_str());
  return all_same ? 0 : 1;  // the two drivers of one model must agree
}
