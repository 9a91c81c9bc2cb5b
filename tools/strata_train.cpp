// strata-train: `strata train` under its earlier name, the same flags.
#include "tools/cli_errors.h"
#include "tools/train_command.h"

int main(int argc, char** argv) {
  return strata::tools::run_guarded("strata-train",
                                    [&] { return strata::tools::train_main(argc, argv, "strata-train"); });
}
