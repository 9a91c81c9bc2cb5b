/*
 * A trainer built outside strata's tree against an installed strata only
 * (its header and libstrata.so): by CMake's find_package(strata) and by
 * pkg-config. It checks the library's version against the header's,
 * trains a tiny GPT a few steps on its own data on the host backend, and
 * prints PASS when the loss fell.
 */
#include <math.h>
#include <stdio.h>
#include <strata/strata.h>

#define STEPS 8

static const char* kConfig =
    "{\"model\": {\"layers\": 1, \"hidden\": 32, \"heads\": 2, \"vocab\": 16, \"max_seq\": 8},"
    " \"batch\": {\"micro_batch\": 4, \"seq\": 8}, \"budgets\": {\"device\": \"64MiB\", \"host\": \"512MiB\"},"
    " \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}, \"pin_memory\": false, \"seed\": 5}";

int main(void) {
  int major = -1, minor = -1, patch = -1;
  strata_get_version(&major, &minor, &patch);
  printf("strata %d.%d.%d (header %d.%d.%d)\n", major, minor, patch, STRATA_VERSION_MAJOR, STRATA_VERSION_MINOR,
         STRATA_VERSION_PATCH);
#if !STRATA_VERSION_AT_LEAST(1, 0, 0)
#error "the consumer is written for strata 1.0's header"
#endif
  if (STRATA_CHECK_VERSION() != STRATA_OK) {
    fprintf(stderr, "consumer: %s\n", strata_last_error());
    return 1;
  }
  strata_trainer* t = NULL;
  if (strata_trainer_create(kConfig, "host", &t) != STRATA_OK) {
    fprintf(stderr, "consumer: %s\n", strata_last_error());
    return 1;
  }
  strata_shape s = STRATA_SHAPE_INIT;
  if (strata_trainer_shape(t, &s) != STRATA_OK) return 1;
  enum { kMax = 4 * 8 };
  int32_t tokens[kMax], targets[kMax];
  const size_t n = (size_t)(s.grad_accum * s.batch * s.seq);
  if (n > kMax) return 1;
  float first = 0, last = 0;
  for (int step = 0; step < STEPS; ++step) {
    for (size_t i = 0; i < n; ++i) {  /* counting sequences: next token = token + 1 */
      tokens[i] = (int32_t)((i + (i / (size_t)s.seq) * 3) % (size_t)s.vocab);
      targets[i] = (tokens[i] + 1) % (int32_t)s.vocab;
    }
    float loss = 0;
    if (strata_trainer_step(t, tokens, targets, n, &loss) != STRATA_OK) {
      fprintf(stderr, "consumer: step %d: %s\n", step + 1, strata_last_error());
      strata_trainer_destroy(t);
      return 1;
    }
    if (step == 0) first = loss;
    last = loss;
  }
  strata_trainer_destroy(t);
  printf("loss %.4f -> %.4f over %d steps\n", first, last, STEPS);
  if (!(isfinite(last) && last < first)) {
    fprintf(stderr, "consumer: the loss did not fall\n");
    return 1;
  }
  puts("PASS");
  return 0;
}
