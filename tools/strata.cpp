// strata: the command. `strata train` and `strata plan` take strata-train's
// flags (docs/CLI.md); `strata capacity` answers the largest model per
// offload mode; `strata bench NAME` runs one of the benchmark programs
// built beside it.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "tools/capacity_command.h"
#include "tools/cli_errors.h"
#include "tools/train_command.h"

namespace {

// The benchmark programs `strata bench NAME` runs (bench/, built beside tools/).
const char* const kBenches[][2] = {{"io", "strata-iobench"},   {"adam", "strata-adambench"},
                                   {"step", "strata-stepbench"}, {"plan", "strata-planbench"},
                                   {"stage", "strata-optstagebench"}};

// Replaces the process with bench NAME's program, the rest of the arguments passed on.
int run_bench(int argc, char** argv) {
  const std::string name = argc > 2 ? argv[2] : "";
  for (const auto& b : kBenches) {
    if (name != b[0]) continue;
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    const std::filesystem::path program = self.parent_path().parent_path() / "bench" / b[1];
    std::vector<char*> args{const_cast<char*>(b[1])};
    for (int i = 3; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    ::execv(program.c_str(), args.data());
    std::fprintf(stderr, "strata bench %s: cannot run %s (built with the benchmarks?)\n", name.c_str(),
                 program.c_str());
    return 2;
  }
  std::fprintf(stderr, "strata bench: say which: io, adam, step, plan or stage (got \"%s\")\n", name.c_str());
  return 2;
}

int run(int argc, char** argv) {
  const std::string sub = argc > 1 ? argv[1] : "";
  // train and plan take strata-train's flags whole.
  if (sub == "train" || sub == "plan") {
    std::string prog = "strata " + sub;
    argv[1] = prog.data();
    return strata::tools::train_main(argc - 1, argv + 1, prog, sub == "plan");
  }
  if (sub == "bench") return run_bench(argc, argv);
  if (!sub.empty() && sub[0] != '-' && sub != "capacity") {
    std::fprintf(stderr, "strata: unknown subcommand \"%s\": one of train, plan, capacity, bench (strata --help)\n",
                 sub.c_str());
    return 2;
  }
  CLI::App app{"strata: train models larger than the device's memory, streaming them among device, host and NVMe"};
  app.require_subcommand(1);
  strata::tools::one_line_errors(app, "strata");
  app.add_subcommand("train", "train a GPT from a config and flags (strata train --help)");
  app.add_subcommand("plan", "the planner's placement and per-tier estimate for a config, without running");
  app.add_subcommand("bench", "a benchmark: strata bench io|adam|step|plan|stage [its flags]");
  strata::tools::add_capacity_command(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return strata::tools::run_guarded(argc > 1 ? std::string("strata ") + argv[1] : "strata",
                                    [&] { return run(argc, argv); });
}
