/*
 * custom_mlp.c: a trainer in plain C of a model strata has never seen — a
 * 16-layer residual tanh MLP (h + tanh(W h + b), a linear last layer),
 * whose forward and backward are written below — using
 * only <strata/strata.h>. strata keeps the model's state (bf16 working
 * weights, gradients, fp32 master weights, Adam states) and updates it; the
 * program computes on the host backend, whose "device" memory is ordinary
 * memory held to a budget.
 *
 * The device holds two layers' weights, two gradients and two activation
 * rows; each layer's input goes to strata as an activation checkpoint in
 * forward and comes back in backward. It trains the same model twice from
 * the same seed:
 *   1. everything in RAM, the device uncapped;
 *   2. weights, optimizer states, gradients and saved activations on
 *      NVMe (the directory given, default /tmp/strata-custom-mlp), the
 *      device held to a tenth of the model states (16 bytes per parameter);
 * prints both loss sequences and exits 0 only when they are equal bit for
 * bit and the loss fell. The device budget is held by strata: anything
 * beyond it (its slots, the activations allocated here) fails the run;
 * each run's description shows its device_peak_bytes.
 *
 *   cc -std=c11 custom_mlp.c $(pkg-config --cflags --libs strata) -lm
 *   ./a.out [NVME_DIR]
 */
#define _POSIX_C_SOURCE 200809L /* mkdir */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strata/strata.h>
#include <sys/stat.h>

enum { kWidth = 64, kLayers = 16, kBatch = 8, kSteps = 60, kBatches = 4 };
static const int64_t kChunk = (int64_t)kWidth * kWidth + kWidth; /* W [out][in], then b */

/* bf16 <-> fp32: the top half of the float, rounded to nearest even. */
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* A small deterministic generator (xorshift64*), uniform in [-1, 1). */
static float uniform(uint64_t* s) {
  *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
  return (float)((*s * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1 << 23) - 1.0f;
}

/* Layer `chunk`'s initial weights, uniform in +-1/sqrt(width); biases 0. */
static int init_layer(void* user, int64_t chunk, float* dst, int64_t count) {
  (void)user;
  uint64_t s = 0x9E3779B97F4A7C15ull ^ (uint64_t)(chunk + 1);
  const float scale = 1.0f / sqrtf((float)kWidth);
  for (int64_t i = 0; i < count; ++i) dst[i] = i < kWidth * kWidth ? uniform(&s) * scale : 0.0f;
  return 0;
}

/* Batch k of a cycle of kBatches: inputs in [-1, 1), targets a smooth function of them. */
static void make_batch(int k, float* x, float* y) {
  uint64_t s = 0xD1B54A32D192ED03ull * (uint64_t)(k % kBatches + 1);
  for (int i = 0; i < kBatch * kWidth; ++i) x[i] = uniform(&s);
  for (int b = 0; b < kBatch; ++b) {
    const float* xb = x + b * kWidth;
    for (int j = 0; j < kWidth; ++j) y[b * kWidth + j] = 0.5f * sinf(xb[j % 3] + xb[(j + 1) % kWidth]);
  }
}

#define TRY(call)                                                                           \
  do {                                                                                      \
    strata_status rc_ = (call);                                                             \
    if (rc_ != STRATA_OK) {                                                                 \
      fprintf(stderr, "custom_mlp: %s: %s: %s\n", #call, strata_status_name(rc_), strata_last_error()); \
      return -1;                                                                            \
    }                                                                                       \
  } while (0)

/* The model's working memory on the device: two activation rows (layer l's
 * input is row l % 2, its output row (l + 1) % 2; the inputs go to strata
 * between forward and backward), and two rows for the gradient flowing back. */
typedef struct {
  float* h;
  float* dh;
  float* dprev;
} Activations;

static float* row(Activations* a, int l) { return a->h + (l % 2) * kBatch * kWidth; }
static const size_t kRowBytes = sizeof(float) * kBatch * kWidth;

static int forward(strata_session* s, Activations* a) {
  for (int l = 0; l < kLayers; ++l) {
    const void* wp;
    TRY(strata_session_acquire(s, l, NULL, &wp));
    const uint16_t* w = wp;
    const float* in = row(a, l);
    float* out = row(a, l + 1);
    TRY(strata_session_save_activation(s, (uint64_t)l, in, kRowBytes)); /* back in backward */
    for (int b = 0; b < kBatch; ++b) {
      for (int o = 0; o < kWidth; ++o) {
        float z = from_bf16(w[kWidth * kWidth + o]);
        for (int i = 0; i < kWidth; ++i) z += from_bf16(w[o * kWidth + i]) * in[b * kWidth + i];
        out[b * kWidth + o] = l + 1 < kLayers ? in[b * kWidth + o] + tanhf(z) : z;
      }
    }
    TRY(strata_session_release(s, l));
  }
  return 0;
}

/* Layer l's backward: its weight gradient into the session's buffer (bf16),
 * the gradient of its input into a->dprev; a->dh holds d(loss)/d(output). */
static int backward_layer(strata_session* s, Activations* a, int l) {
  const int act = kBatch * kWidth;
  const void* wp;
  void* gp;
  TRY(strata_session_acquire(s, l, NULL, &wp));
  TRY(strata_session_gradient_buffer(s, l, &gp));
  const uint16_t* w = wp;
  uint16_t* g = gp;
  /* This layer's output is the next one's input, still in its row; its own
   * input comes back from strata. */
  TRY(strata_session_load_activation(s, (uint64_t)l, row(a, l), kRowBytes));
  const float* in = row(a, l);
  const float* out = row(a, l + 1);
  if (l + 1 < kLayers) {
    /* out = in + tanh(z): the residual passes dh on as it is, tanh scales it. */
    memcpy(a->dprev, a->dh, sizeof(float) * (size_t)act);
    for (int i = 0; i < act; ++i) {
      const float t = out[i] - in[i];
      a->dh[i] *= 1.0f - t * t;
    }
  } else {
    memset(a->dprev, 0, sizeof(float) * (size_t)act);
  }
  for (int o = 0; o < kWidth; ++o) {
    float gb = 0;
    for (int b = 0; b < kBatch; ++b) gb += a->dh[b * kWidth + o];
    g[kWidth * kWidth + o] = to_bf16(gb);
    for (int i = 0; i < kWidth; ++i) {
      float gw = 0;
      const float wi = from_bf16(w[o * kWidth + i]);
      for (int b = 0; b < kBatch; ++b) {
        gw += a->dh[b * kWidth + o] * in[b * kWidth + i];
        a->dprev[b * kWidth + i] += a->dh[b * kWidth + o] * wi;
      }
      g[o * kWidth + i] = to_bf16(gw);
    }
  }
  TRY(strata_session_release(s, l));
  TRY(strata_session_submit_gradient(s, l, NULL));
  float* t = a->dh;
  a->dh = a->dprev;
  a->dprev = t;
  return 0;
}

/* One step on batch k; the mean squared error into *loss. */
static int step(strata_session* s, Activations* a, int k, float* loss) {
  const int act = kBatch * kWidth;
  float y[kBatch * kWidth];
  make_batch(k, row(a, 0), y);
  TRY(strata_session_begin_step(s, 1.0f));
  if (forward(s, a) != 0) return -1;
  const float* pred = row(a, kLayers);
  double sum = 0;
  for (int i = 0; i < act; ++i) {
    const float d = pred[i] - y[i];
    sum += (double)d * d;
    a->dh[i] = 2.0f * d / (float)act;
  }
  for (int l = kLayers - 1; l >= 0; --l) {
    if (backward_layer(s, a, l) != 0) return -1;
  }
  strata_step_verdict v = STRATA_STEP_VERDICT_INIT;
  TRY(strata_session_end_step(s, &v));
  *loss = (float)(sum / act);
  return 0;
}

/* Trains kSteps steps under `config`; the losses into `losses`, the
 * session's description (JSON) printed. */
static int train(const char* config, float* losses) {
  strata_session* s = NULL;
  TRY(strata_session_create(config, "host", &s));
  int rc = 0;
  for (int l = 0; l < kLayers && rc == 0; ++l) {
    char name[32];
    snprintf(name, sizeof name, "layer%d", l);
    if (strata_session_add_chunk_fn(s, name, kChunk, init_layer, NULL, NULL) != STRATA_OK) rc = -1;
    /* Its tensors, by name: what a checkpoint (strata_session_save) holds. */
    const int64_t w_shape[2] = {kWidth, kWidth}, b_shape[1] = {kWidth};
    char tensor[48];
    snprintf(tensor, sizeof tensor, "%s.weight", name);
    if (rc == 0 && strata_session_add_tensor(s, l, tensor, 0, w_shape, 2) != STRATA_OK) rc = -1;
    snprintf(tensor, sizeof tensor, "%s.bias", name);
    if (rc == 0 && strata_session_add_tensor(s, l, tensor, (int64_t)kWidth * kWidth, b_shape, 1) != STRATA_OK) rc = -1;
  }
  /* Backward submits the gradients from the last layer to the first (with
   * them on NVMe, strata holds the model to this order). */
  int64_t order[kLayers];
  for (int l = 0; l < kLayers; ++l) order[l] = kLayers - 1 - l;
  if (rc == 0 && strata_session_set_gradient_order(s, order, kLayers) != STRATA_OK) rc = -1;
  Activations a = {0};
  void *h = NULL, *dh = NULL, *dprev = NULL;
  if (rc == 0 && (strata_session_start(s) != STRATA_OK || strata_session_device_alloc(s, 2 * kRowBytes, &h) ||
                  strata_session_device_alloc(s, kRowBytes, &dh) || strata_session_device_alloc(s, kRowBytes, &dprev))) {
    rc = -1;
  }
  if (rc != 0) fprintf(stderr, "custom_mlp: setting up: %s\n", strata_last_error());
  a.h = h, a.dh = dh, a.dprev = dprev;
  for (int k = 0; k < kSteps && rc == 0; ++k) rc = step(s, &a, k, &losses[k]);
  if (rc == 0 && strata_session_finalize(s) != STRATA_OK) rc = -1;
  printf("%s\n", strata_session_describe(s));
  strata_session_destroy(s);
  return rc;
}

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : "/tmp/strata-custom-mlp";
  mkdir(dir, 0755);
  const uint64_t states = (uint64_t)kLayers * (uint64_t)kChunk * 16; /* 2 + 2 + 12 bytes per parameter */
  const uint64_t budget = states / 10;
  char resident[512], nvme[1024];
  snprintf(resident, sizeof resident,
           "{\"precision\": \"bf16\", \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.003, \"weight_decay\": 0.01},"
           " \"pin_memory\": false}");
  snprintf(nvme, sizeof nvme,
           "{\"precision\": \"bf16\", \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.003, \"weight_decay\": 0.01},"
           " \"pin_memory\": false, \"nvme_paths\": [\"%s\"],"
           " \"placement\": {\"weights\": \"nvme\", \"states\": \"nvme\", \"activations\": \"nvme\","
           " \"gradients\": \"nvme\"},"
           " \"budgets\": {\"device\": %llu}}",
           dir, (unsigned long long)budget);
  float a[kSteps], b[kSteps];
  printf("custom_mlp: %d layers x %d wide, %lld parameters, model states %llu bytes\n", kLayers, kWidth,
         (long long)(kLayers * kChunk), (unsigned long long)states);
  printf("run 1: everything in RAM\n");
  if (train(resident, a) != 0) return 1;
  printf(
      "run 2: weights, optimizer states, gradients and saved activations on NVMe in %s, device budget %llu "
      "bytes "
      "(1/10 of the model states)\n",
      dir, (unsigned long long)budget);
  if (train(nvme, b) != 0) return 1;
  int same = 1;
  printf("step  loss (RAM)        loss (NVMe)\n");
  for (int k = 0; k < kSteps; ++k) {
    same = same && memcmp(&a[k], &b[k], sizeof(float)) == 0;
    printf("%4d  %.9g  %.9g%s\n", k + 1, a[k], b[k], memcmp(&a[k], &b[k], sizeof(float)) == 0 ? "" : "  DIFFERENT");
  }
  float first = 0, last = 0;
  for (int k = 0; k < kBatches; ++k) first += a[k], last += a[kSteps - kBatches + k];
  const int fell = last < 0.5f * first;
  printf("losses %s bit for bit; the loss over a cycle of the %d batches went from %.6g to %.6g (%s)\n",
         same ? "equal" : "NOT equal", kBatches, first / kBatches, last / kBatches, fell ? "fell" : "did NOT fall");
  return same && fell ? 0 : 1;
}
