/*
 * The built-in GPT's loss sequence, fixed seed, against the one recorded in
 * tests/bindings/golden_losses.txt (hex floats: bit for bit). Whatever
 * moves inside the engine (the GPT becoming a client of the session, a
 * new placement rule), these runs must give the same losses.
 *
 * Each run is a config (a placement, a precision, accumulation) trained
 * for kSteps steps on the built-in synthetic stream through the C API.
 * The ctest pins OpenBLAS's kernels (OPENBLAS_CORETYPE=Haswell): its GEMM
 * rounds differently per CPU family, and every CPU this runs on has AVX2.
 *
 * Usage: golden_losses_test FILE NVME_DIR [--write]. --write records FILE
 * from this build instead of checking it (done once, before a change that
 * must not move the numbers). Exits 1 on a mismatch, naming the run and step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <strata/strata.h>
#include <string.h>

enum { kSteps = 8, kRuns = 4 };

static const char* kBase =
    "{\"model\": {\"layers\": 3, \"hidden\": 64, \"heads\": 2, \"vocab\": 96, \"max_seq\": 32},"
    " \"batch\": {\"micro_batch\": 2, \"seq\": 32, \"grad_accum\": %d},"
    " \"budgets\": {\"device\": \"256MiB\", \"host\": \"1GiB\"},"
    " \"precision\": \"%s\", \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.003, \"weight_decay\": 0.01},"
    " \"gradient_clipping\": %s, \"seed\": 7, \"pin_memory\": false%s}";

struct Run {
  const char* name;
  int grad_accum;
  const char* precision;
  const char* clip;
  const char* placement; /* %s: the NVMe directory */
};

static const struct Run kRunList[kRuns] = {
    {"bf16_resident", 1, "bf16", "0", ", \"placement\": {\"weights\": \"device\", \"states\": \"host\"}"},
    {"bf16_streamed_accum2", 2, "bf16", "0.5",
     ", \"placement\": {\"weights\": \"host\", \"states\": \"host\", \"activations\": \"host\"}"},
    {"fp16_states_nvme", 1, "fp16", "1.0",
     ", \"nvme_paths\": [\"%s\"], \"placement\": {\"weights\": \"host\", \"states\": \"nvme\"}"},
    {"bf16_all_nvme_accum2", 2, "bf16", "0",
     ", \"nvme_paths\": [\"%s\"], \"placement\": {\"weights\": \"nvme\", \"states\": \"nvme\", \"activations\": "
     "\"nvme\"}"},
};

/* Trains one run; fills losses[kSteps]. 0 on success. */
static int train(const struct Run* r, const char* nvme, float* losses) {
  char placement[512], config[2048];
  snprintf(placement, sizeof placement, r->placement, nvme);
  snprintf(config, sizeof config, kBase, r->grad_accum, r->precision, r->clip, placement);
  strata_trainer* t = NULL;
  if (strata_trainer_create(config, "host", &t) != STRATA_OK) {
    fprintf(stderr, "%s: create: %s\n", r->name, strata_last_error());
    return 1;
  }
  for (int k = 0; k < kSteps; ++k) {
    if (strata_trainer_step(t, NULL, NULL, 0, &losses[k]) != STRATA_OK) {
      fprintf(stderr, "%s: step %d: %s\n", r->name, k + 1, strata_last_error());
      strata_trainer_destroy(t);
      return 1;
    }
  }
  const strata_status s = strata_trainer_finalize(t);
  strata_trainer_destroy(t);
  if (s != STRATA_OK) fprintf(stderr, "%s: finalize: %s\n", r->name, strata_last_error());
  return s != STRATA_OK;
}

int main(int argc, char** argv) {
  if (argc < 3 || (argc == 4 && strcmp(argv[3], "--write") != 0) || argc > 4) {
    fprintf(stderr, "usage: %s FILE NVME_DIR [--write]\n", argv[0]);
    return 2;
  }
  const int write = argc == 4;
  float got[kRuns][kSteps];
  for (int i = 0; i < kRuns; ++i) {
    if (train(&kRunList[i], argv[2], got[i]) != 0) return 1;
  }
  if (write) {
    FILE* f = fopen(argv[1], "w");
    if (f == NULL) {
      perror(argv[1]);
      return 1;
    }
    fprintf(f, "# run step loss (hex float): tests/bindings/golden_losses_test.c --write\n");
    for (int i = 0; i < kRuns; ++i) {
      for (int k = 0; k < kSteps; ++k) fprintf(f, "%s %d %a\n", kRunList[i].name, k + 1, (double)got[i][k]);
    }
    if (fclose(f) != 0) {
      perror(argv[1]);
      return 1;
    }
    printf("wrote %s\n", argv[1]);
    return 0;
  }
  FILE* f = fopen(argv[1], "r");
  if (f == NULL) {
    perror(argv[1]);
    return 1;
  }
  char line[256], name[64];
  int step = 0, compared = 0, failed = 0;
  double want = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (line[0] == '#') continue;
    if (sscanf(line, "%63s %d %la", name, &step, &want) != 3) {
      fprintf(stderr, "%s: bad line: %s", argv[1], line);
      fclose(f);
      return 1;
    }
    int run = -1;
    for (int i = 0; i < kRuns; ++i) {
      if (strcmp(kRunList[i].name, name) == 0) run = i;
    }
    if (run < 0 || step < 1 || step > kSteps) {
      fprintf(stderr, "%s: no run %s step %d here\n", argv[1], name, step);
      fclose(f);
      return 1;
    }
    ++compared;
    if ((float)want != got[run][step - 1]) {
      ++failed;
      fprintf(stderr, "%s step %d: loss %a (%.9g), recorded %a (%.9g)\n", name, step, (double)got[run][step - 1],
              (double)got[run][step - 1], want, want);
    }
  }
  fclose(f);
  if (compared != kRuns * kSteps) {
    fprintf(stderr, "%s: %d losses recorded, %d expected\n", argv[1], compared, kRuns * kSteps);
    return 1;
  }
  printf("%d losses of %d runs compared, %d differ\n", compared, kRuns, failed);
  printf(failed == 0 ? "PASS\n" : "FAIL\n");
  return failed != 0;
}
