/*
 * The C ABI against an older caller. Compiled against the header of the
 * previous release (tests/bindings/abi/<release>/strata/strata.h, kept as
 * it shipped) and linked against today's libstrata.so, it checks that the
 * library serves it and reads and writes every struct as that header lays
 * it out; then, as a caller of an older release still would, it hands the
 * library structs shorter than today's (struct_size covering fewer
 * fields) and checks that the library reads no byte past them (the bytes
 * after are an inaccessible page) and writes none (the bytes after keep
 * their canary), and that a struct from a newer header is refused only
 * when it sets a field this library does not have. Exits 0 and prints
 * PASS, or prints each failure.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strata/strata.h>
#include <sys/mman.h>
#include <unistd.h>

static int g_failures;
#define CHECK(cond, ...)                                       \
  do {                                                         \
    if (!(cond)) {                                             \
      ++g_failures;                                            \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);     \
      fprintf(stderr, __VA_ARGS__);                            \
      fprintf(stderr, " (last error: %s)\n", strata_last_error()); \
    }                                                          \
  } while (0)

static const char* kTrainer =
    "{\"model\": {\"layers\": 1, \"hidden\": 32, \"heads\": 2, \"vocab\": 16, \"max_seq\": 8},"
    " \"batch\": {\"micro_batch\": 4, \"seq\": 8}, \"gradient_accumulation_steps\": 2,"
    " \"budgets\": {\"device\": \"64MiB\", \"host\": \"512MiB\"}, \"pin_memory\": false, \"seed\": 5}";
static const char* kSession =
    "{\"precision\": \"fp32\", \"pin_memory\": false, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.25},"
    " \"budgets\": {\"device\": \"1MiB\", \"host\": \"64MiB\"}}";
enum { kElems = 100 };

/* `bytes` at the very end of a readable page, an inaccessible page after. */
static void* at_page_end(size_t bytes, void** base, size_t* mapped) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  *mapped = 2 * page;
  char* m = mmap(NULL, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return NULL;
  if (mprotect(m + page, page, PROT_NONE) != 0) return NULL;
  *base = m;
  return m + page - bytes;
}

/* One step of a one-chunk session whose gradient is 1 everywhere. */
static strata_status step(strata_session* s, strata_step_verdict* v) {
  const void* w = NULL;
  void* g = NULL;
  if (strata_session_begin_step(s, 1.0f) != STRATA_OK || strata_session_acquire(s, 0, NULL, &w) != STRATA_OK ||
      strata_session_release(s, 0) != STRATA_OK || strata_session_gradient_buffer(s, 0, &g) != STRATA_OK) {
    return STRATA_INTERNAL;
  }
  for (int i = 0; i < kElems; ++i) ((float*)g)[i] = 1.0f;
  if (strata_session_submit_gradient(s, 0, NULL) != STRATA_OK) return STRATA_INTERNAL;
  return strata_session_end_step(s, v);
}

static void versions(void) {
  CHECK(STRATA_CHECK_VERSION() == STRATA_OK, "today's library serves the %d.%d header", STRATA_VERSION_MAJOR,
        STRATA_VERSION_MINOR);
  int major = -1, minor = -1;
  strata_get_version(&major, &minor, NULL);
  CHECK(major == STRATA_VERSION_MAJOR && minor >= STRATA_VERSION_MINOR, "library %d.%d", major, minor);
}

static void shape(void) {
  strata_trainer* t = NULL;
  CHECK(strata_trainer_create(kTrainer, "host", &t) == STRATA_OK, "a trainer");
  if (t == NULL) return;
  strata_shape full = STRATA_SHAPE_INIT;
  CHECK(strata_trainer_shape(t, &full) == STRATA_OK && full.struct_size == sizeof full && full.grad_accum == 2 &&
            full.batch == 4 && full.seq == 8 && full.vocab == 16,
        "the shape: %lld %lld %lld %lld", (long long)full.grad_accum, (long long)full.batch, (long long)full.seq,
        (long long)full.vocab);
  /* A caller whose struct ends after batch: seq and vocab keep their canary. */
  strata_shape older = STRATA_SHAPE_INIT;
  older.struct_size = offsetof(strata_shape, seq);
  older.seq = older.vocab = -7;
  CHECK(strata_trainer_shape(t, &older) == STRATA_OK && older.grad_accum == 2 && older.batch == 4 &&
            older.seq == -7 && older.vocab == -7 && older.struct_size == offsetof(strata_shape, seq),
        "a shorter shape written only as far as its size");
  strata_shape unset = STRATA_SHAPE_INIT;
  unset.struct_size = 0;
  CHECK(strata_trainer_shape(t, &unset) == STRATA_INVALID_ARGUMENT && strstr(strata_last_error(), "struct_size"),
        "a struct_size of 0 is refused");
  strata_trainer_destroy(t);
}

static void verdict(void) {
  strata_session* s = NULL;
  float init[kElems];
  for (int i = 0; i < kElems; ++i) init[i] = (float)i;
  CHECK(strata_session_create(kSession, "host", &s) == STRATA_OK, "a session");
  if (s == NULL) return;
  CHECK(strata_session_add_chunk(s, "w", kElems, init, NULL) == STRATA_OK, "a chunk");
  strata_step_verdict v = STRATA_STEP_VERDICT_INIT;
  CHECK(step(s, &v) == STRATA_OK, "step 1");
  CHECK(v.struct_size == sizeof v && v.step == 1 && v.lr == 0.25 && v.grad_norm == 10.0 && !v.clipped &&
            !v.skipped && !v.rolled_back && v.loss_scale == 1.0,
        "the verdict: step %lld lr %g norm %g loss scale %g", (long long)v.step, v.lr, v.grad_norm, v.loss_scale);
  /* An older caller's verdict without lr and loss_scale: never written. */
  strata_step_verdict older = STRATA_STEP_VERDICT_INIT;
  older.struct_size = offsetof(strata_step_verdict, lr);
  older.lr = older.loss_scale = -3.0;
  CHECK(step(s, &older) == STRATA_OK && older.step == 2 && older.grad_norm == 10.0 && older.lr == -3.0 &&
            older.loss_scale == -3.0,
        "a shorter verdict written only as far as its size: step %lld lr %g", (long long)older.step, older.lr);
  /* Refused before the step ends: the step stays open, and ends after. */
  strata_step_verdict unset = STRATA_STEP_VERDICT_INIT;
  unset.struct_size = 1;
  const void* w = NULL;
  void* g = NULL;
  CHECK(strata_session_begin_step(s, 1.0f) == STRATA_OK && strata_session_acquire(s, 0, NULL, &w) == STRATA_OK &&
            strata_session_release(s, 0) == STRATA_OK && strata_session_gradient_buffer(s, 0, &g) == STRATA_OK,
        "step 3 under way");
  memset(g, 0, kElems * sizeof(float));
  CHECK(strata_session_submit_gradient(s, 0, NULL) == STRATA_OK, "step 3's gradient");
  CHECK(strata_session_end_step(s, &unset) == STRATA_INVALID_ARGUMENT, "a verdict of 1 byte is refused");
  CHECK(strata_session_steps_done(s) == 2, "and the step is still open: %lld",
        (long long)strata_session_steps_done(s));
  CHECK(strata_session_end_step(s, NULL) == STRATA_OK && strata_session_steps_done(s) == 3, "then it ends");
  strata_session_destroy(s);
}

static void model_plan(void) {
  int64_t counts[4] = {4096, 4096, 4096, 4096};
  strata_model_plan m = STRATA_MODEL_PLAN_INIT;
  m.chunk_counts = counts;
  m.chunk_count = 4;
  m.micro_batch = 2;
  m.flops = 1e6;
  const char* config = "{\"pin_memory\": false, \"budgets\": {\"device\": \"8MiB\", \"host\": \"64MiB\"}}";
  char text[8192];
  CHECK(strata_session_plan(config, "host", &m, text, sizeof text, NULL) == STRATA_OK &&
            strstr(text, "\"fits\":true") != NULL,
        "a plan: %s", text);
  /* An older caller's struct, ending before chunk_dtypes, against an
   * inaccessible page: the library must not read past it. */
  void* base = NULL;
  size_t mapped = 0;
  const size_t older = offsetof(strata_model_plan, chunk_dtypes);
  strata_model_plan* edge = at_page_end(older, &base, &mapped);
  CHECK(edge != NULL, "a guarded page");
  if (edge != NULL) {
    memcpy(edge, &m, older);
    edge->struct_size = older;
    CHECK(strata_session_plan(config, "host", edge, text, sizeof text, NULL) == STRATA_OK &&
              strstr(text, "\"fits\":true") != NULL,
          "a shorter plan read only as far as its size");
    munmap(base, mapped);
  }
  /* A newer caller's struct: later bytes zero are taken, set ones refused. */
  struct {
    strata_model_plan plan;
    uint64_t later_field;
  } newer;
  memset(&newer, 0, sizeof newer);
  newer.plan = m;
  newer.plan.struct_size = sizeof newer;
  CHECK(strata_session_plan(config, "host", &newer.plan, text, sizeof text, NULL) == STRATA_OK,
        "a newer struct whose later fields are zero");
  newer.later_field = 1;
  CHECK(strata_session_plan(config, "host", &newer.plan, text, sizeof text, NULL) == STRATA_INVALID_ARGUMENT &&
            strstr(strata_last_error(), "does not have") != NULL,
        "a newer struct setting a field this library lacks is refused");
  m.struct_size = 0;
  CHECK(strata_session_plan(config, "host", &m, text, sizeof text, NULL) == STRATA_INVALID_ARGUMENT,
        "an unset struct_size is refused");
}

int main(void) {
  printf("header %d.%d.%d against library ", STRATA_VERSION_MAJOR, STRATA_VERSION_MINOR, STRATA_VERSION_PATCH);
  int major = 0, minor = 0, patch = 0;
  strata_get_version(&major, &minor, &patch);
  printf("%d.%d.%d\n", major, minor, patch);
  versions();
  shape();
  verdict();
  model_plan();
  if (g_failures > 0) {
    printf("%d failures\n", g_failures);
    return 1;
  }
  printf("PASS\n");
  return 0;
}
