// `strata train` and `strata plan` (and the strata-train program, the same
// flags): a GPT trained, or only planned, from a config and flags
// (docs/CLI.md).
#pragma once

#include <string>

namespace strata::tools {

// Parses `argc`/`argv` (argv[0] is the program's name) as the train flags
// and runs: trains, or with `plan_only` (or --plan-only) prints the plan
// and returns 0 when it fits the budgets, 1 when not. `prog` names the
// program in messages. The exit status.
int train_main(int argc, char** argv, const std::string& prog, bool plan_only = false);

}  // namespace strata::tools
