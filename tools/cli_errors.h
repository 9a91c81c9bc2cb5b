// How the strata programs report a bad flag: one line on stderr, naming the
// program (and subcommand), the flag and what is allowed, then a non-zero
// exit — CLI11's default adds a second line, "Run with --help ...".
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace strata::tools {

inline void one_line_errors(CLI::App& app, const std::string& prog) {
  app.failure_message([prog](const CLI::App* a, const CLI::Error& e) {
    std::string name = prog;
    for (const CLI::App* s : a->get_subcommands()) name += " " + s->get_name();
    return name + ": " + e.what() + " (" + name + " --help lists the flags)\n";
  });
}

}  // namespace strata::tools
