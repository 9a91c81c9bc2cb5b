/*
 * The C API from C (compiled as C11, linked against libstrata.so alone): bad
 * configs and bad data are refused with the reason and change nothing; the
 * trainer learns the caller's data; the states on NVMe give the same losses
 * as in RAM; a checkpoint written at step 5 and loaded into a new trainer
 * continues bit for bit; the description and the plan alone are there;
 * the session calls refuse bad configs and misuse, changing nothing; a
 * chunk of its own working type and a plan for such a model.
 * Prints one line per failed check and a summary; exits 1 on any failure.
 */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strata/strata.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int g_checks = 0, g_failed = 0;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    ++g_checks;                                                                \
    if (!(cond)) {                                                             \
      ++g_failed;                                                              \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, " (last error: %s)\n", strata_last_error());             \
    }                                                                          \
  } while (0)

enum { kSteps = 10, kSaveAt = 5 };

static const char* kConfig =
    "{\"model\": {\"layers\": 2, \"hidden\": 32, \"heads\": 4, \"vocab\": 64, \"max_seq\": 16},"
    " \"batch\": {\"micro_batch\": 4, \"seq\": 16, \"grad_accum\": 2},"
    " \"budgets\": {\"device\": \"64MiB\", \"host\": \"1GiB\"},"
    " \"precision\": \"bf16\", \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01, \"weight_decay\": 0.01},"
    " \"seed\": 3, \"unknown_key\": 1%s}";

/* Step k's data: sequences stepping by 5 from a pseudo-random start. */
static void make_data(int k, const strata_shape* s, int32_t* tokens, int32_t* targets) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(k + 1);
  const int64_t rows = s->grad_accum * s->batch;
  for (int64_t r = 0; r < rows; ++r) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int64_t v = (int64_t)(x % (uint64_t)s->vocab);
    for (int64_t t = 0; t < s->seq; ++t) {
      tokens[r * s->seq + t] = (int32_t)v;
      v = (v + 5) % s->vocab;
      targets[r * s->seq + t] = (int32_t)v;
    }
  }
}

static strata_trainer* create(const char* extra) {
  char config[2048];
  snprintf(config, sizeof config, kConfig, extra);
  strata_trainer* t = NULL;
  strata_status s = strata_trainer_create(config, NULL, &t);
  CHECK(s == STRATA_OK && t != NULL, "create: %s", strata_status_name(s));
  return t;
}

/* Steps `from`..`to`-1 on their data into losses[]; 0 on a failed step. */
static int run(strata_trainer* t, int from, int to, float* losses) {
  strata_shape shape = STRATA_SHAPE_INIT;
  if (strata_trainer_shape(t, &shape) != STRATA_OK) return 0;
  const size_t n = (size_t)(shape.grad_accum * shape.batch * shape.seq);
  int32_t* tokens = malloc(n * sizeof *tokens);
  int32_t* targets = malloc(n * sizeof *targets);
  int ok = tokens != NULL && targets != NULL;
  for (int k = from; k < to && ok; ++k) {
    make_data(k, &shape, tokens, targets);
    strata_status s = strata_trainer_step(t, tokens, targets, n, &losses[k]);
    CHECK(s == STRATA_OK, "step %d: %s", k + 1, strata_status_name(s));
    ok = s == STRATA_OK;
  }
  free(tokens);
  free(targets);
  return ok;
}

static int remove_entry(const char* path, const struct stat* st, int flag, struct FTW* ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

/* A trainer with `placement` (a JSON object) and its NVMe files in a new
   directory `name` under `root`: its describe() names `says`, and its
   kSteps losses are `losses`, bit for bit. 0 when it could not be made. */
static int same_losses_placed(const char* root, const char* name, const char* placement, const char* says,
                              const float* losses) {
  char dir[600], extra[900];
  snprintf(dir, sizeof dir, "%s/%s", root, name);
  CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
  snprintf(extra, sizeof extra, ", \"nvme_paths\": [\"%s\"], \"placement\": %s", dir, placement);
  strata_trainer* t = create(extra);
  if (t == NULL) return 0;
  const char* d = strata_trainer_describe(t);
  if (d == NULL) d = "(NULL)";
  CHECK(strstr(d, says) != NULL, "placement %s: %s", placement, d);
  float got[kSteps];
  CHECK(run(t, 0, kSteps, got), "steps with placement %s", placement);
  for (int k = 0; k < kSteps; ++k) {
    CHECK(memcmp(&got[k], &losses[k], sizeof(float)) == 0, "step %d: %.9g with placement %s, %.9g in RAM", k + 1,
          got[k], placement, losses[k]);
  }
  strata_trainer_destroy(t);
  return 1;
}

/* gradient_accumulation_steps through the C API: each chunk's gradient is
 * submitted once per micro-batch, a step short of them is refused naming
 * the count, and the update takes the fp32 sum: with lr 1, eps 1 and a
 * scale of 1/2 a gradient of 1.0 then 2^-9 updates the master weight to
 * -(g / (|g| + 1)) with g their mean, which a sum rounded to bf16 misses. */
static void session_accumulation(void) {
  strata_session* s = NULL;
  CHECK(strata_session_create("{\"gradient_accumulation_steps\": 0}", NULL, &s) == STRATA_INVALID_ARGUMENT,
        "zero micro-batches");
  CHECK(strstr(strata_last_error(), "gradient_accumulation_steps") != NULL, "names the key: %s", strata_last_error());
  CHECK(strata_session_create("{\"gradient_accumulation_steps\": 2, \"optimizer\": {\"type\": \"adam\", "
                              "\"params\": {\"lr\": 1.0, \"eps\": 1.0}}}",
                              NULL, &s) == STRATA_OK,
        "create: %s", strata_last_error());
  if (s == NULL) return;
  CHECK(strata_session_add_chunk(s, "w", 1, NULL, NULL) == STRATA_OK, "chunk w");
  CHECK(strata_session_begin_step(s, 0.5f) == STRATA_OK, "begin");
  const uint16_t grads[2] = {0x3F80 /* 1.0 */, 0x3B00 /* 2^-9 */};
  for (int k = 0; k < 2; ++k) {
    const void* w = NULL;
    void* g = NULL;
    CHECK(strata_session_acquire(s, 0, NULL, &w) == STRATA_OK, "acquire for micro-batch %d", k);
    CHECK(strata_session_release(s, 0) == STRATA_OK, "release");
    CHECK(strata_session_gradient_buffer(s, 0, &g) == STRATA_OK && g != NULL, "gradient buffer %d", k);
    if (g != NULL) memcpy(g, &grads[k], 2);
    CHECK(strata_session_submit_gradient(s, 0, NULL) == STRATA_OK, "submit micro-batch %d", k);
    if (k == 0) {
      strata_step_verdict early = STRATA_STEP_VERDICT_INIT;
      CHECK(strata_session_end_step(s, &early) == STRATA_FAILED_PRECONDITION, "a micro-batch missing");
      CHECK(strstr(strata_last_error(), "1 of 2 micro-batches") != NULL, "counts them: %s", strata_last_error());
    }
  }
  CHECK(strata_session_submit_gradient(s, 0, NULL) == STRATA_FAILED_PRECONDITION, "a third submit");
  strata_step_verdict v = STRATA_STEP_VERDICT_INIT;
  CHECK(strata_session_end_step(s, &v) == STRATA_OK, "end: %s", strata_last_error());
  float master = 0;
  CHECK(strata_session_read_master(s, 0, &master, 1) == STRATA_OK, "read");
  /* Adam's first step with its bias corrected moves by lr * g / (|g| + eps). */
  const float g = 0.5f * (1.0f + 0x1p-9f); /* the mean of the fp32 sum */
  const float want = -g / (g + 1.0f), rounded = -0.5f / 1.5f;
  CHECK(fabsf(master - want) < 1e-6f, "master %.9g, want %.9g (the fp32 sum)", master, want);
  CHECK(fabsf(master - rounded) > 1e-4f, "%.9g is the update of the sum rounded to bf16", master);
  strata_session_destroy(s);
}

/* The session calls from C: bad configs and misuse are refused with the
 * reason and change nothing; a two-chunk model steps once. */
static void session_misuse(const char* root) {
  strata_session* s = (strata_session*)1;
  CHECK(strata_session_create("{\"precision\": \"fp8\"}", NULL, &s) == STRATA_INVALID_ARGUMENT && s == NULL,
        "fp8 working weights");
  CHECK(strstr(strata_last_error(), "precision") != NULL, "names the key");
  /* fp32 working weights: what the device computes with is the initial values' own bits. */
  CHECK(strata_session_create("{\"precision\": \"fp32\"}", NULL, &s) == STRATA_OK, "fp32: %s", strata_last_error());
  if (s != NULL) {
    const float values[3] = {0.1f, -2.5f, 3.0e-20f};
    const void* w = NULL;
    CHECK(strata_session_add_chunk(s, "f", 3, values, NULL) == STRATA_OK, "an fp32 chunk");
    CHECK(strata_session_begin_step(s, 1.0f) == STRATA_OK, "begin (fp32)");
    CHECK(strata_session_acquire(s, 0, NULL, &w) == STRATA_OK && w != NULL && memcmp(w, values, sizeof values) == 0,
          "the fp32 weights are the values given");
    CHECK(strata_session_release(s, 0) == STRATA_OK && strata_session_cancel_step(s) == STRATA_OK, "cancel (fp32)");
    strata_session_destroy(s);
    s = NULL;
  }
  /* Choices a session cannot honour are said, on stderr and in describe's warnings, never dropped silently;
   * speculate_in_ram and delayed_update it honours. */
  CHECK(strata_session_create("{\"speculate_in_ram\": true, \"delayed_update\": true, \"numa_node\": 0,"
                              " \"batch\": {\"vertical\": true}, \"model\": {\"layers\": 2},"
                              " \"session\": {\"prefetch_depth\": 2, \"resident_first\": true}}",
                              NULL, &s) == STRATA_OK,
        "a session of the trainer's choices: %s", strata_last_error());
  if (s != NULL) {
    const int64_t shape[2] = {1, 3};
    CHECK(strata_session_add_chunk(s, "w", 4, NULL, NULL) == STRATA_OK, "a chunk");
    CHECK(strata_session_add_tensor(s, 0, NULL, 0, shape, 2) == STRATA_INVALID_ARGUMENT, "a tensor without a name");
    CHECK(strata_session_add_tensor(s, 0, "t", 0, NULL, 2) == STRATA_INVALID_ARGUMENT, "a tensor without a shape");
    CHECK(strata_session_add_tensor(s, 0, "t", 2, shape, 2) == STRATA_INVALID_ARGUMENT &&
              strstr(strata_last_error(), "end") != NULL,
          "a tensor past the chunk's end: %s", strata_last_error());
    CHECK(strata_session_add_tensor(s, 1, "t", 0, shape, 2) == STRATA_INVALID_ARGUMENT, "a tensor of no chunk");
    CHECK(strata_session_add_tensor(s, 0, "t", 1, shape, 2) == STRATA_OK, "a tensor: %s", strata_last_error());
    CHECK(strata_session_add_chunk(s, "w2", 4, NULL, NULL) == STRATA_OK, "a second chunk (resident_first)");
    CHECK(strata_session_start(s) == STRATA_OK, "start: %s", strata_last_error());
    CHECK(strata_session_add_tensor(s, 0, "u", 0, shape, 1) == STRATA_FAILED_PRECONDITION, "a tensor after start");
    /* An activation prefetched into one buffer is the bytes saved from another. */
    void *from = NULL, *into = NULL;
    CHECK(strata_session_device_alloc(s, 64, &from) == STRATA_OK &&
              strata_session_device_alloc(s, 64, &into) == STRATA_OK,
          "device buffers: %s", strata_last_error());
    if (from != NULL && into != NULL) {
      for (int i = 0; i < 64; ++i) ((unsigned char*)from)[i] = (unsigned char)(3 * i + 1);
      CHECK(strata_session_save_activation(s, 3, from, 64) == STRATA_OK, "save: %s", strata_last_error());
      CHECK(strata_session_prefetch_activation(s, 3, into, 64) == STRATA_OK, "prefetch: %s", strata_last_error());
      CHECK(strata_session_load_activation(s, 3, into, 64) == STRATA_OK && memcmp(from, into, 64) == 0,
            "the prefetched bytes: %s", strata_last_error());
      CHECK(strata_session_prefetch_activation(s, 4, into, 64) == STRATA_NOT_FOUND, "a key never saved");
      /* The stream-ordered calls: without a stream the blocking ones; a
       * stream on the host backend is refused. */
      memset(into, 0, 64);
      for (int i = 0; i < 64; ++i) ((unsigned char*)from)[i] = (unsigned char)(5 * i + 2);
      CHECK(strata_session_save_activation_on(s, 5, from, 64, NULL) == STRATA_OK, "save on: %s", strata_last_error());
      CHECK(strata_session_prefetch_activation_on(s, 5, into, 64, NULL) == STRATA_OK, "prefetch on: %s",
            strata_last_error());
      CHECK(strata_session_load_activation_on(s, 5, into, 64, NULL) == STRATA_OK && memcmp(from, into, 64) == 0,
            "the bytes saved and loaded without a stream: %s", strata_last_error());
      CHECK(strata_session_activation_saved(s, 5, NULL) == STRATA_INVALID_ARGUMENT, "activation_saved needs a stream");
      CHECK(strata_session_save_activation_on(s, 6, from, 64, (void*)1) == STRATA_UNIMPLEMENTED &&
                strstr(strata_last_error(), "no native streams") != NULL,
            "a stream to save on the host: %s", strata_last_error());
      CHECK(strata_session_activation_saved(s, 5, (void*)1) == STRATA_UNIMPLEMENTED, "a stream to wait on the host");
      CHECK(strata_session_load_activation_on(s, 5, into, 64, (void*)1) == STRATA_UNIMPLEMENTED,
            "a stream to load on the host");
    }
    const char* d = strata_session_describe(s);
    CHECK(
        d != NULL && strstr(d, "\"speculate_in_ram\":true") != NULL && strstr(d, "config key speculate_in_ram") == NULL,
        "speculate_in_ram is honoured: %s", d ? d : "(null)");
    CHECK(d != NULL && strstr(d, "config key batch.vertical") != NULL && strstr(d, "config key numa_node") == NULL &&
              strstr(d, "config key delayed_update") == NULL && strstr(d, "\"delayed_update\":true") != NULL,
          "describe warns of batch.vertical and keeps numa_node and delayed_update: %s", d ? d : "(null)");
    CHECK(d != NULL && strstr(d, "model: this run's model reads no config keys") != NULL,
          "describe warns that the built-in GPT's keys go unread: %s", d ? d : "(null)");
    CHECK(d != NULL && strstr(d, "\"prefetch_depth\":2") != NULL && strstr(d, "\"resident_first\":true") != NULL,
          "the session keys reach the session: %s", d ? d : "(null)");
    strata_session_destroy(s);
    s = NULL;
  }
  CHECK(strata_session_create("{\"placement\": {\"states\": \"nvme\"}}", NULL, &s) == STRATA_INVALID_ARGUMENT,
        "states on NVMe without nvme_paths");
  CHECK(strata_session_create("{}", "tpu", &s) == STRATA_INVALID_ARGUMENT, "an unknown device");
  CHECK(strata_session_create("{nope", NULL, &s) == STRATA_INVALID_ARGUMENT, "malformed JSON");
  CHECK(strata_session_create("{}", NULL, &s) == STRATA_OK && s != NULL, "create");
  if (s == NULL) return;
  const float init[3] = {0.5f, -0.25f, 1.0f};
  int64_t a = -1, b = -1;
  CHECK(strata_session_add_chunk(s, NULL, 3, init, &a) == STRATA_INVALID_ARGUMENT, "a NULL name");
  CHECK(strata_session_add_chunk(s, "a", 0, init, &a) == STRATA_INVALID_ARGUMENT, "count 0");
  CHECK(strata_session_add_chunk(s, "a", 3, init, &a) == STRATA_OK && a == 0, "chunk a");
  CHECK(strata_session_add_chunk(s, "a", 3, init, &b) == STRATA_INVALID_ARGUMENT, "a repeated name");
  CHECK(strata_session_add_chunk(s, "b", 5, NULL, &b) == STRATA_OK && b == 1, "chunk b");
  const int64_t twice[2] = {0, 0}, backward[2] = {1, 0};
  CHECK(strata_session_set_gradient_order(s, twice, 2) == STRATA_INVALID_ARGUMENT, "a chunk twice in the order");
  CHECK(strata_session_set_gradient_order(s, backward, 1) == STRATA_INVALID_ARGUMENT, "an order missing a chunk");
  CHECK(strata_session_set_gradient_order(s, NULL, 2) == STRATA_INVALID_ARGUMENT, "a NULL order");
  CHECK(strata_session_set_gradient_order(s, backward, 2) == STRATA_OK, "the gradient order: %s", strata_last_error());
  CHECK(strata_session_begin_step(s, 0.0f) == STRATA_INVALID_ARGUMENT, "grad_scale 0");
  const void* w = NULL;
  void* g = NULL;
  /* Outside a step: the weights for an evaluation, read-only. */
  CHECK(strata_session_acquire(s, 0, NULL, &w) == STRATA_OK && w != NULL, "acquire outside a step: %s",
        strata_last_error());
  CHECK(w != NULL && ((const uint16_t*)w)[0] == 0x3F00, "the evaluation reads a's initial bf16 0.5");
  CHECK(strata_session_gradient_buffer(s, 0, &g) == STRATA_FAILED_PRECONDITION, "a gradient outside a step");
  CHECK(strata_session_begin_step(s, 1.0f) == STRATA_FAILED_PRECONDITION, "a step while a is held outside one");
  CHECK(strata_session_release(s, 0) == STRATA_OK, "the evaluation's release");
  CHECK(strata_session_release(s, 0) == STRATA_FAILED_PRECONDITION, "a release too many");
  CHECK(strata_session_begin_step(s, 1.0f) == STRATA_OK, "begin");
  CHECK(strata_session_set_gradient_order(s, backward, 2) == STRATA_FAILED_PRECONDITION, "the order in a step");
  CHECK(strata_session_add_chunk(s, "c", 3, NULL, NULL) == STRATA_FAILED_PRECONDITION, "a chunk after start");
  CHECK(strata_session_acquire(s, 2, NULL, &w) == STRATA_INVALID_ARGUMENT, "an unknown chunk");
  CHECK(strata_session_acquire(s, -1, NULL, &w) == STRATA_INVALID_ARGUMENT, "a negative chunk");
  CHECK(strata_session_acquire(s, 0, (void*)1, &w) == STRATA_UNIMPLEMENTED &&
            strstr(strata_last_error(), "no native streams") != NULL,
        "a stream on the host backend: %s", strata_last_error());
  CHECK(strata_session_submit_gradient(s, 0, (void*)1) == STRATA_UNIMPLEMENTED, "a stream to submit on the host");
  CHECK(strata_session_acquire(s, 0, NULL, &w) == STRATA_OK && w != NULL, "acquire");
  CHECK(w != NULL && ((const uint16_t*)w)[0] == 0x3F00, "a's first weight is bf16 0.5");
  CHECK(strata_session_release(s, 0) == STRATA_OK, "release");
  CHECK(strata_session_submit_gradient(s, 1, NULL) == STRATA_FAILED_PRECONDITION, "a submit with no gradient");
  CHECK(strata_session_gradient_buffer(s, 1, &g) == STRATA_OK && g != NULL, "b's gradient buffer");
  if (g != NULL) memset(g, 0, 10);
  CHECK(strata_session_submit_gradient(s, 1, NULL) == STRATA_OK, "submit b");
  CHECK(strata_session_submit_gradient(s, 1, NULL) == STRATA_FAILED_PRECONDITION, "b twice");
  CHECK(strata_session_acquire(s, 1, NULL, &w) == STRATA_FAILED_PRECONDITION, "b after its submit");
  strata_step_verdict v = STRATA_STEP_VERDICT_INIT;
  CHECK(strata_session_end_step(s, &v) == STRATA_FAILED_PRECONDITION, "a gradient missing");
  CHECK(strstr(strata_last_error(), "\"a\"") != NULL, "names the chunk: %s", strata_last_error());
  CHECK(strata_session_gradient_buffer(s, 0, &g) == STRATA_OK, "a's gradient buffer");
  if (g != NULL) memset(g, 0, 6);
  CHECK(strata_session_submit_gradient(s, 0, NULL) == STRATA_OK, "submit a");
  CHECK(strata_session_end_step(s, &v) == STRATA_OK && v.step == 1 && v.skipped == 0, "end");
  CHECK(strata_session_steps_done(s) == 1, "one step");
  float master[3] = {0};
  CHECK(strata_session_read_master(s, 0, master, 2) == STRATA_INVALID_ARGUMENT, "a short buffer");
  CHECK(strata_session_read_master(s, 0, master, 3) == STRATA_OK && master[0] == 0.5f, "a's master: %g", master[0]);
  CHECK(strata_session_save(s, NULL) == STRATA_INVALID_ARGUMENT, "save to NULL");
  CHECK(strata_session_save(s, root) == STRATA_OK, "save");
  strata_session* t = NULL;
  CHECK(strata_session_create("{}", NULL, &t) == STRATA_OK, "a second session");
  if (t != NULL) {
    CHECK(strata_session_add_chunk(t, "a", 3, NULL, NULL) == STRATA_OK, "its chunk a");
    CHECK(strata_session_load(t, root) == STRATA_FAILED_PRECONDITION, "a checkpoint of other chunks");
    CHECK(strata_session_steps_done(t) == 0, "nothing loaded");
    strata_session_destroy(t);
  }
  t = NULL;
  CHECK(strata_session_create("{}", NULL, &t) == STRATA_OK, "a third session");
  if (t != NULL) {
    CHECK(strata_session_add_chunk(t, "a", 3, NULL, NULL) == STRATA_OK && strata_session_add_chunk(t, "b", 5, NULL, NULL) == STRATA_OK,
          "the same chunks");
    CHECK(strata_session_load(t, root) == STRATA_OK && strata_session_steps_done(t) == 1, "load");
    float loaded[3] = {0};
    CHECK(strata_session_read_master(t, 0, loaded, 3) == STRATA_OK && memcmp(loaded, master, sizeof master) == 0,
          "the loaded master weights");
    strata_session_destroy(t);
  }
  const char* d = strata_session_describe(s);
  CHECK(d != NULL && strstr(d, "\"steps_done\":1") != NULL, "describe: %s", d ? d : "(null)");
  CHECK(strata_session_abort(s) == STRATA_OK, "abort");
  CHECK(strata_session_begin_step(s, 1.0f) == STRATA_CANCELLED, "a step after abort");
  CHECK(strata_session_async_error(s) == STRATA_CANCELLED, "async error after abort");
  strata_session_destroy(s);
  strata_session_destroy(NULL);
}

/* The JSON object after `"key":` in `text`, braces and all, into `out`
 * (empty when absent or too long). */
static void json_object_at(const char* text, const char* key, char* out, size_t capacity) {
  out[0] = '\0';
  char needle[64];
  snprintf(needle, sizeof needle, "\"%s\":", key);
  const char* p = strstr(text, needle);
  if (p == NULL || (p = strchr(p, '{')) == NULL) return;
  int depth = 0;
  for (const char* q = p; *q != '\0'; ++q) {
    depth += *q == '{' ? 1 : *q == '}' ? -1 : 0;
    if (depth == 0) {
      const size_t n = (size_t)(q - p) + 1;
      if (n < capacity) {
        memcpy(out, p, n);
        out[n] = '\0';
      }
      return;
    }
  }
}

/* A model of the caller's planned from C: the placement the plan gives is
 * one a session of those budgets starts with; a budget nothing fits is
 * refused naming the nearest placement; a bad description is refused. */
static void session_plan(const char* root) {
  enum { kChunks = 16, kWidth = 64, kBatch = 8 };
  int64_t counts[kChunks];
  for (int c = 0; c < kChunks; ++c) counts[c] = (int64_t)kWidth * kWidth + kWidth;
  const uint64_t row = sizeof(float) * kBatch * kWidth;
  strata_model_plan m = {sizeof m, counts, kChunks, 0, kBatch, kChunks, kChunks, row, 2, 2 * row,
                         6.0 * 16 * 4160 * kBatch, NULL};
  char dir[600], config[2048], text[8192], keys[1024];
  snprintf(dir, sizeof dir, "%s/plan", root);
  mkdir(dir, 0755);
  /* The states (12 bytes a parameter, about 800 KB) do not fit the host's 512 KiB. */
  snprintf(config, sizeof config,
           "{\"precision\": \"bf16\", \"pin_memory\": false, \"nvme_paths\": [\"%s\"],"
           " \"budgets\": {\"device\": %llu, \"host\": \"512KiB\", \"nvme\": \"64MiB\"}",
           dir, (unsigned long long)(kChunks * 4160 * 16 / 10));
  char whole[2100];
  snprintf(whole, sizeof whole, "%s}", config);
  size_t length = 0;
  CHECK(strata_session_plan(whole, "host", &m, NULL, 0, &length) == STRATA_OK && length > 0, "the plan's length");
  CHECK(strata_session_plan(whole, "host", &m, text, sizeof text, NULL) == STRATA_OK, "a plan");
  CHECK(strlen(text) == length, "the whole plan: %zu of %zu", strlen(text), length);
  CHECK(strstr(text, "\"fits\":true") != NULL && strstr(text, "\"states\":\"nvme\"") != NULL &&
            strstr(text, "\"resident_first\":false") != NULL,
        "it fits with the states on NVMe: %s", text);
  json_object_at(text, "config", keys, sizeof keys);
  CHECK(keys[0] == '{', "the plan's config keys: %s", text);
  if (keys[0] == '{') {
    /* The plan's keys merged into the config: a session of it starts
     * within the budgets (strata checks them before it allocates). */
    char planned[4096];
    snprintf(planned, sizeof planned, "%s, %s", config, keys + 1);
    strata_session* s = NULL;
    CHECK(strata_session_create(planned, "host", &s) == STRATA_OK, "a session of the plan: %s", planned);
    for (int c = 0; s != NULL && c < kChunks; ++c) {
      char name[16];
      snprintf(name, sizeof name, "c%d", c);
      CHECK(strata_session_add_chunk(s, name, counts[c], NULL, NULL) == STRATA_OK, "chunk %d", c);
    }
    CHECK(s != NULL && strata_session_start(s) == STRATA_OK, "the planned session starts: %s", planned);
    strata_session_destroy(s);
    /* Without the plan's keys the states stay in RAM, which the host budget refuses. */
    CHECK(strata_session_create(whole, "host", &s) == STRATA_OK, "a session without the plan");
    for (int c = 0; s != NULL && c < kChunks; ++c) {
      char name[16];
      snprintf(name, sizeof name, "c%d", c);
      strata_session_add_chunk(s, name, counts[c], NULL, NULL);
    }
    CHECK(s != NULL && strata_session_start(s) == STRATA_RESOURCE_EXHAUSTED, "the unplanned one does not start");
    strata_session_destroy(s);
  }
  CHECK(strata_session_plan("{\"budgets\": {\"device\": 4096, \"host\": \"64KiB\"}}", "host", &m, text, sizeof text,
                            NULL) == STRATA_RESOURCE_EXHAUSTED &&
            strstr(strata_last_error(), "no placement") != NULL,
        "nothing fits: %s", strata_last_error());
  CHECK(strata_session_plan(whole, "host", NULL, NULL, 0, NULL) == STRATA_INVALID_ARGUMENT, "no model");
  strata_model_plan empty = m;
  empty.chunk_count = 0;
  CHECK(strata_session_plan(whole, "host", &empty, NULL, 0, NULL) == STRATA_INVALID_ARGUMENT &&
            strstr(strata_last_error(), "no chunks") != NULL,
        "a model without chunks: %s", strata_last_error());
  CHECK(strata_session_plan(whole, "tpu", &m, NULL, 0, NULL) == STRATA_INVALID_ARGUMENT, "an unknown device");
  /* A chunk in fp32: its weights and gradients are planned in RAM. */
  const char* types[kChunks];
  for (int c = 0; c < kChunks; ++c) types[c] = c == 3 ? "fp32" : "bf16";
  strata_model_plan typed = m;
  typed.chunk_dtypes = types;
  /* Room for the weights in RAM beside the states' staging. */
  snprintf(whole, sizeof whole,
           "{\"precision\": \"bf16\", \"pin_memory\": false, \"nvme_paths\": [\"%s\"],"
           " \"budgets\": {\"device\": %llu, \"host\": \"2MiB\", \"nvme\": \"64MiB\"}}",
           dir, (unsigned long long)(kChunks * 4160 * 16 / 10));
  CHECK(strata_session_plan(whole, "host", &typed, text, sizeof text, NULL) == STRATA_OK &&
            strstr(text, "\"weights\":\"host\"") != NULL && strstr(text, "\"gradients\":\"host\"") != NULL,
        "a model with an fp32 chunk keeps its weights in RAM: %s (%s)", text, strata_last_error());
  types[5] = "fp8";
  CHECK(strata_session_plan(whole, "host", &typed, NULL, 0, NULL) == STRATA_INVALID_ARGUMENT &&
            strstr(strata_last_error(), "chunk 5") != NULL,
        "an unknown chunk type: %s", strata_last_error());
  types[5] = "fp16";
  CHECK(strata_session_plan(whole, "host", &typed, NULL, 0, NULL) == STRATA_INVALID_ARGUMENT &&
            strstr(strata_last_error(), "fp16 session") != NULL,
        "fp16 chunks in a bf16 session: %s", strata_last_error());
}

/* The caller's fp16 loss scale between steps; refused inside a step and for
 * a scale that is no power of two, changing nothing. */
static void session_loss_scale(void) {
  strata_session* s = NULL;
  CHECK(strata_session_create("{\"precision\": \"fp16\", \"pin_memory\": false}", NULL, &s) == STRATA_OK,
        "an fp16 session: %s", strata_last_error());
  if (s == NULL) return;
  const double initial = strata_session_loss_scale(s);
  CHECK(strata_session_set_loss_scale(s, 3.0) == STRATA_INVALID_ARGUMENT &&
            strstr(strata_last_error(), "power of two") != NULL,
        "3: %s", strata_last_error());
  CHECK(strata_session_set_loss_scale(s, 0.25) == STRATA_INVALID_ARGUMENT, "below the minimum");
  CHECK(strata_session_loss_scale(s) == initial, "unchanged: %g", strata_session_loss_scale(s));
  CHECK(strata_session_set_loss_scale(s, 1024.0) == STRATA_OK && strata_session_loss_scale(s) == 1024.0, "1024: %s",
        strata_last_error());
  CHECK(strata_session_add_chunk(s, "w", 4, NULL, NULL) == STRATA_OK, "a chunk");
  CHECK(strata_session_begin_step(s, 1.0f) == STRATA_OK, "begin: %s", strata_last_error());
  CHECK(strata_session_set_loss_scale(s, 64.0) == STRATA_FAILED_PRECONDITION, "inside a step");
  CHECK(strata_session_cancel_step(s) == STRATA_OK && strata_session_loss_scale(s) == 1024.0, "still 1024");
  strata_session_destroy(s);
  s = NULL;
  CHECK(strata_session_create("{}", NULL, &s) == STRATA_OK, "a bf16 session");
  if (s == NULL) return;
  CHECK(strata_session_set_loss_scale(s, 1.0) == STRATA_OK, "bf16 takes 1");
  CHECK(strata_session_set_loss_scale(s, 2.0) == STRATA_INVALID_ARGUMENT && strata_session_loss_scale(s) == 1.0,
        "bf16 scales nothing: %s", strata_last_error());
  strata_session_destroy(s);
}

/* A chunk of its own working type from C: fp32 norms beside bf16 weights.
 * Bad types and chunks are refused changing nothing; the fp32 chunk's
 * weights are its values' own bits; with the weights on NVMe the start is
 * refused naming the chunk. */
static void session_chunk_dtypes(const char* root) {
  strata_session* s = NULL;
  CHECK(strata_session_create("{\"precision\": \"bf16\", \"pin_memory\": false}", NULL, &s) == STRATA_OK,
        "a bf16 session: %s", strata_last_error());
  if (s == NULL) return;
  const float norm[3] = {0.1f, -2.5f, 3.0e-20f};
  const char* t = NULL;
  CHECK(strata_session_add_chunk(s, "norm", 3, norm, NULL) == STRATA_OK, "chunk norm");
  CHECK(strata_session_add_chunk(s, "w", 4, NULL, NULL) == STRATA_OK, "chunk w");
  CHECK(strata_session_set_chunk_dtype(s, 0, "fp8") == STRATA_INVALID_ARGUMENT &&
            strstr(strata_last_error(), "fp8") != NULL,
        "fp8: %s", strata_last_error());
  CHECK(strata_session_set_chunk_dtype(s, 0, "fp16") == STRATA_INVALID_ARGUMENT &&
            strstr(strata_last_error(), "fp16 session") != NULL,
        "fp16 in a bf16 session: %s", strata_last_error());
  CHECK(strata_session_set_chunk_dtype(s, 0, NULL) == STRATA_INVALID_ARGUMENT, "a NULL type");
  CHECK(strata_session_set_chunk_dtype(s, 2, "fp32") == STRATA_INVALID_ARGUMENT, "no chunk 2");
  CHECK(strata_session_set_chunk_dtype(NULL, 0, "fp32") == STRATA_INVALID_ARGUMENT, "no session");
  CHECK(strata_session_chunk_dtype(s, 0, &t) == STRATA_OK && t != NULL && strcmp(t, "bf16") == 0,
        "unchanged by the refusals: %s", t ? t : "(null)");
  CHECK(strata_session_chunk_dtype(s, 0, NULL) == STRATA_INVALID_ARGUMENT, "a NULL answer");
  CHECK(strata_session_set_chunk_dtype(s, 0, "fp32") == STRATA_OK, "norm in fp32: %s", strata_last_error());
  CHECK(strata_session_chunk_dtype(s, 0, &t) == STRATA_OK && strcmp(t, "fp32") == 0, "norm is fp32");
  CHECK(strata_session_chunk_dtype(s, 1, &t) == STRATA_OK && strcmp(t, "bf16") == 0, "w stays bf16");
  const char* d = strata_session_describe(s);
  CHECK(d != NULL && strstr(d, "{\"count\":3,\"dtype\":\"fp32\",\"name\":\"norm\"}") != NULL, "describe: %s",
        d ? d : "(null)");
  CHECK(strata_session_begin_step(s, 1.0f) == STRATA_OK, "begin: %s", strata_last_error());
  const void* w = NULL;
  CHECK(strata_session_acquire(s, 0, NULL, &w) == STRATA_OK && w != NULL && memcmp(w, norm, sizeof norm) == 0,
        "the fp32 weights are the values given");
  CHECK(strata_session_release(s, 0) == STRATA_OK, "release");
  void* g = NULL;
  CHECK(strata_session_gradient_buffer(s, 0, &g) == STRATA_OK && g != NULL, "norm's gradient buffer");
  const float grad[3] = {1.0f, -1.0f, 0.0f};
  if (g != NULL) memcpy(g, grad, sizeof grad); /* fp32, as the chunk's weights */
  CHECK(strata_session_submit_gradient(s, 0, NULL) == STRATA_OK, "submit norm");
  CHECK(strata_session_gradient_buffer(s, 1, &g) == STRATA_OK && g != NULL, "w's gradient buffer");
  if (g != NULL) memset(g, 0, 4 * 2); /* bf16 zeros */
  CHECK(strata_session_submit_gradient(s, 1, NULL) == STRATA_OK, "submit w");
  CHECK(strata_session_end_step(s, NULL) == STRATA_OK, "end: %s", strata_last_error());
  float master[3] = {0};
  CHECK(strata_session_read_master(s, 0, master, 3) == STRATA_OK && master[0] < norm[0] && master[1] > norm[1],
        "norm moved against its fp32 gradient: %g %g", master[0], master[1]);
  CHECK(strata_session_set_chunk_dtype(s, 1, "fp32") == STRATA_FAILED_PRECONDITION, "a type after start");
  CHECK(strata_session_chunk_dtype(s, 1, &t) == STRATA_OK && strcmp(t, "bf16") == 0, "w still bf16");
  strata_session_destroy(s);

  char config[1024], dir[600];
  snprintf(dir, sizeof dir, "%s/typed", root);
  mkdir(dir, 0755);
  snprintf(config, sizeof config,
           "{\"pin_memory\": false, \"nvme_paths\": [\"%s\"], \"placement\": {\"weights\": \"nvme\", \"states\": "
           "\"nvme\"}}",
           dir);
  s = NULL;
  CHECK(strata_session_create(config, NULL, &s) == STRATA_OK, "weights on NVMe: %s", strata_last_error());
  if (s == NULL) return;
  CHECK(strata_session_add_chunk(s, "norm", 3, norm, NULL) == STRATA_OK &&
            strata_session_add_chunk(s, "w", 4, NULL, NULL) == STRATA_OK &&
            strata_session_set_chunk_dtype(s, 0, "fp32") == STRATA_OK,
        "the chunks: %s", strata_last_error());
  CHECK(strata_session_start(s) == STRATA_FAILED_PRECONDITION && strstr(strata_last_error(), "\"norm\"") != NULL &&
            strstr(strata_last_error(), "NVMe") != NULL,
        "an fp32 chunk with the weights on NVMe: %s", strata_last_error());
  strata_session_destroy(s);
}

int main(void) {
  CHECK(STRATA_CHECK_VERSION() == STRATA_OK, "the header's own release: %s", strata_last_error());
  CHECK(strata_check_version(STRATA_VERSION_MAJOR, 0) == STRATA_OK, "an older minor is served");
  CHECK(strata_check_version(STRATA_VERSION_MAJOR, STRATA_VERSION_MINOR + 1) == STRATA_FAILED_PRECONDITION &&
            strstr(strata_last_error(), "built against strata") != NULL,
        "a newer minor is not: %s", strata_last_error());
  CHECK(strata_check_version(STRATA_VERSION_MAJOR + 1, 0) == STRATA_FAILED_PRECONDITION, "another major is not");
#if !STRATA_VERSION_AT_LEAST(1, 0, 0) || STRATA_VERSION_AT_LEAST(STRATA_VERSION_MAJOR, STRATA_VERSION_MINOR + 1, 0)
#error "STRATA_VERSION_AT_LEAST compares releases wrongly"
#endif
  {
    int major = -1, minor = -1, patch = -1;
    strata_get_version(&major, &minor, &patch);
    CHECK(major == STRATA_VERSION_MAJOR && minor == STRATA_VERSION_MINOR && patch == STRATA_VERSION_PATCH,
          "library version %d.%d.%d, header %d.%d.%d", major, minor, patch, STRATA_VERSION_MAJOR,
          STRATA_VERSION_MINOR, STRATA_VERSION_PATCH);
    strata_get_version(NULL, NULL, NULL); /* each output optional */
  }
  const char* tmp = getenv("TMPDIR");
  char root[512];
  snprintf(root, sizeof root, "%s/strata-c-api-XXXXXX", tmp != NULL && *tmp != '\0' ? tmp : "/tmp");
  if (mkdtemp(root) == NULL) {
    perror("mkdtemp");
    return 1;
  }

  /* Bad configs: refused with the reason; *out stays NULL. */
  strata_trainer* bad = (strata_trainer*)&g_checks;
  CHECK(strata_trainer_create("{\"model\": ", NULL, &bad) == STRATA_INVALID_ARGUMENT && bad == NULL, "invalid JSON");
  CHECK(strstr(strata_last_error(), "not valid JSON") != NULL, "message");
  CHECK(strata_trainer_create("{\"model\": {\"hidden\": 33, \"heads\": 4}}", NULL, &bad) == STRATA_INVALID_ARGUMENT,
        "heads that do not divide hidden");
  CHECK(strstr(strata_last_error(), "heads must divide hidden") != NULL, "message");
  CHECK(strata_trainer_create("{}", "tpu", &bad) == STRATA_INVALID_ARGUMENT, "unknown device");
  CHECK(strstr(strata_last_error(), "host, cuda") != NULL, "message");
  CHECK(strata_trainer_create(NULL, NULL, &bad) == STRATA_INVALID_ARGUMENT, "NULL config");
  /* "cuda" where there is no GPU (or no CUDA in the build): UNIMPLEMENTED,
   * as the header promises, not INTERNAL with the driver's raw words. */
  {
    char config[2048];
    snprintf(config, sizeof config, kConfig, "");
    strata_trainer* gpu = NULL;
    const strata_status s = strata_trainer_create(config, "cuda", &gpu);
    CHECK(s == STRATA_OK || s == STRATA_UNIMPLEMENTED, "cuda: %s", strata_status_name(s));
    CHECK(s == STRATA_OK || strstr(strata_last_error(), "host") != NULL, "the message names the way out");
    strata_trainer_destroy(gpu);
  }
  strata_trainer_destroy(NULL);

  /* Bad data: refused, nothing changed. */
  strata_trainer* a = create("");
  if (a == NULL) return 1;
  strata_shape shape = STRATA_SHAPE_INIT;
  CHECK(strata_trainer_shape(a, &shape) == STRATA_OK, "shape");
  CHECK(shape.grad_accum == 2 && shape.batch == 4 && shape.seq == 16 && shape.vocab == 64, "shape %lld %lld %lld %lld",
        (long long)shape.grad_accum, (long long)shape.batch, (long long)shape.seq, (long long)shape.vocab);
  int32_t tokens[128], targets[128];
  make_data(0, &shape, tokens, targets);
  CHECK(strata_trainer_step(a, tokens, targets, 127, NULL) == STRATA_INVALID_ARGUMENT, "short data");
  CHECK(strstr(strata_last_error(), "expected 128 tokens") != NULL, "message");
  tokens[9] = 64;
  CHECK(strata_trainer_step(a, tokens, targets, 128, NULL) == STRATA_INVALID_ARGUMENT, "token outside the vocabulary");
  CHECK(strstr(strata_last_error(), "token 9 is 64") != NULL, "message");
  CHECK(strata_trainer_step(a, tokens, NULL, 128, NULL) == STRATA_INVALID_ARGUMENT, "NULL targets");
  CHECK(strata_trainer_steps_done(a) == 0, "steps done %lld", (long long)strata_trainer_steps_done(a));

  /* The whole run, a checkpoint at step 5 on the way. */
  float losses[kSteps], resumed[kSteps];
  CHECK(run(a, 0, kSaveAt, losses), "first steps");
  char ckpt[600];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", root);
  CHECK(strata_trainer_save(a, ckpt) == STRATA_OK, "save");
  CHECK(run(a, kSaveAt, kSteps, losses), "last steps");
  printf("c api: loss %.4f -> %.4f over %d steps\n", losses[0], losses[kSteps - 1], kSteps);
  CHECK(losses[kSteps - 1] < 0.7f * losses[0], "loss %.4f -> %.4f", losses[0], losses[kSteps - 1]);
  CHECK(strata_trainer_steps_done(a) == kSteps, "steps done");
  const char* d = strata_trainer_describe(a);
  if (d == NULL) d = "(NULL)";
  CHECK(strstr(d, "\"placement\"") != NULL && strstr(d, "\"steps_done\":10") != NULL, "describe: %s", d);
  CHECK(strstr(d, "\"updates_done\":10") != NULL && strstr(d, "\"lr\":") != NULL, "describe: %s", d);
  CHECK(strstr(d, "unknown key unknown_key") != NULL, "describe lists the config's warnings: %s", d);
  strata_trainer_destroy(a);

  /* Resume: steps 6..10 again, the same bits. */
  strata_trainer* b = create("");
  if (b == NULL) return 1;
  CHECK(strata_trainer_load(b, "/nonexistent/strata") != STRATA_OK, "load from nowhere");
  CHECK(strata_trainer_load(b, ckpt) == STRATA_OK, "load");
  CHECK(strata_trainer_steps_done(b) == kSaveAt, "steps done after load %lld", (long long)strata_trainer_steps_done(b));
  CHECK(run(b, kSaveAt, kSteps, resumed), "resumed steps");
  for (int k = kSaveAt; k < kSteps; ++k) {
    CHECK(memcmp(&resumed[k], &losses[k], sizeof(float)) == 0, "step %d: %.9g resumed, %.9g before", k + 1, resumed[k],
          losses[k]);
  }
  /* The synthetic stream too. */
  float synthetic = 0;
  CHECK(strata_trainer_step(b, NULL, NULL, 0, &synthetic) == STRATA_OK && isfinite(synthetic), "synthetic step");
  /* Finalize lands the work in flight and reports it; abort makes every
   * later call CANCELLED, changing nothing, until destroy. */
  CHECK(strata_trainer_async_error(b) == STRATA_OK, "no background failure");
  CHECK(strata_trainer_async_error(NULL) == STRATA_INVALID_ARGUMENT, "async error NULL");
  CHECK(strata_trainer_finalize(b) == STRATA_OK, "finalize");
  CHECK(strata_trainer_finalize(NULL) == STRATA_INVALID_ARGUMENT, "finalize NULL");
  CHECK(strata_trainer_abort(NULL) == STRATA_INVALID_ARGUMENT, "abort NULL");
  const int64_t before_abort = strata_trainer_steps_done(b);
  CHECK(strata_trainer_abort(b) == STRATA_OK, "abort");
  CHECK(strata_trainer_step(b, NULL, NULL, 0, &synthetic) == STRATA_CANCELLED, "a step after abort");
  CHECK(strstr(strata_last_error(), "aborted") != NULL, "the message says why");
  CHECK(strata_trainer_save(b, ckpt) == STRATA_CANCELLED, "a save after abort");
  CHECK(strata_trainer_load(b, ckpt) == STRATA_CANCELLED, "a load after abort");
  CHECK(strata_trainer_finalize(b) == STRATA_CANCELLED, "finalize after abort");
  CHECK(strata_trainer_steps_done(b) == before_abort, "nothing ran after abort");
  strata_trainer_destroy(b);

  /* strata_trainer_resume: created from the checkpoint, the same bits. */
  char resume_config[2048];
  snprintf(resume_config, sizeof resume_config, kConfig, "");
  strata_trainer* r = (strata_trainer*)1;
  CHECK(strata_trainer_resume(resume_config, NULL, "/nonexistent/strata", &r) == STRATA_NOT_FOUND && r == NULL,
        "resume from nowhere");
  CHECK(strata_trainer_resume(resume_config, NULL, NULL, &r) == STRATA_INVALID_ARGUMENT, "resume from NULL");
  CHECK(strata_trainer_resume(resume_config, NULL, ckpt, &r) == STRATA_OK && r != NULL, "resume");
  if (r != NULL) {
    CHECK(strata_trainer_steps_done(r) == kSaveAt, "steps done after resume");
    memset(resumed, 0, sizeof resumed);
    CHECK(run(r, kSaveAt, kSteps, resumed), "steps after resume");
    for (int k = kSaveAt; k < kSteps; ++k) {
      CHECK(memcmp(&resumed[k], &losses[k], sizeof(float)) == 0, "step %d: %.9g after resume, %.9g before", k + 1,
            resumed[k], losses[k]);
    }
    strata_trainer_destroy(r);
  }

  /* The optimizer states on NVMe, then the gradients there too
     (placement.gradients): the same losses. */
  if (!same_losses_placed(root, "states", "{\"states\": \"nvme\"}", "optimizer states on nvme", losses)) return 1;
  if (!same_losses_placed(root, "grads", "{\"states\": \"nvme\", \"gradients\": \"nvme\"}", "gradients on nvme",
                          losses)) {
    return 1;
  }

  /* The plan alone, whole and truncated. */
  char config[2048], text[4096], small[16];
  snprintf(config, sizeof config, kConfig, "");
  size_t length = 0, length2 = 0;
  int fits = 0;
  CHECK(strata_plan(config, NULL, text, sizeof text, &length, &fits) == STRATA_OK, "plan");
  CHECK(fits == 1 && length == strlen(text) && strstr(text, "plan:") != NULL, "plan text (%zu): %s", length, text);
  CHECK(strata_plan(config, NULL, small, sizeof small, &length2, NULL) == STRATA_OK, "plan, truncated");
  CHECK(length2 == length && strlen(small) == sizeof small - 1 && strncmp(small, text, sizeof small - 1) == 0,
        "truncated plan: %s", small);
  CHECK(strata_plan("{\"budgets\": {\"device\": \"1MiB\", \"host\": \"1MiB\"}}", NULL, NULL, 0, NULL, NULL) ==
            STRATA_RESOURCE_EXHAUSTED,
        "a config that fits nowhere");
  CHECK(strstr(strata_last_error(), "fits") != NULL, "message");

  char session_root[600];
  snprintf(session_root, sizeof session_root, "%s/session", root);
  session_misuse(session_root);
  session_accumulation();
  session_plan(root);
  session_chunk_dtypes(root);
  session_loss_scale();

  nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  printf("c api test: %d checks, %d failed\n", g_checks, g_failed);
  return g_failed == 0 ? 0 : 1;
}
