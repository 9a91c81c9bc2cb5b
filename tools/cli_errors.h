// How the strata programs report a bad flag: one line on stderr, naming the
// program (and subcommand), the flag and what is allowed, then a non-zero
// exit — CLI11's default adds a second line, "Run with --help ...". And
// how they keep any exception from aborting them (run_guarded).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <string>

namespace strata::tools {

inline void one_line_errors(CLI::App& app, const std::string& prog) {
  app.failure_message([prog](const CLI::App* a, const CLI::Error& e) {
    std::string name = prog;
    for (const CLI::App* s : a->get_subcommands()) name += " " + s->get_name();
    return name + ": " + e.what() + " (" + name + " --help lists the flags)\n";
  });
}

// Runs a program's body, so that no exception leaves it: one that escapes
// every layer's own handling (a bug, or memory exhausted outside the
// budgets' checks) is one line naming the program and exit status 1,
// never an abort.
template <class Body>
int run_guarded(const std::string& prog, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: out of memory (beyond what the budgets hold; lower budgets.host?)\n", prog.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", prog.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: internal error: an unknown exception\n", prog.c_str());
  }
  return 1;
}

}  // namespace strata::tools
