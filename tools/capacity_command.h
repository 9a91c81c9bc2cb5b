// `strata capacity`: the largest GPT that trains on this machine in each
// offload mode, first by planning and then by really training a few steps,
// printed as a table and written as JSON / CSV (docs/CLI.md).
#pragma once

#include <CLI/CLI.hpp>

namespace strata::tools {

// Adds the `capacity` subcommand to `app`; it runs from app's parse
// callback and ends the process with its exit status.
void add_capacity_command(CLI::App& app);

}  // namespace strata::tools
