/*
 * strata/trainer.h: the built-in GPT's trainer. A trainer is built from a
 * JSON config (strata's own keys, or the offload subset of a DeepSpeed
 * config, as strata-train --config takes them: docs/CONFIG.md), placed by
 * the planner within the config's budgets and constraints, stepped on the
 * caller's tokens, checkpointed and resumed bit for bit. A trainer is used
 * by one thread at a time; different trainers may be used from different
 * threads. Reference: docs/C_API_TRAINER.md.
 */
#ifndef STRATA_TRAINER_H_
#define STRATA_TRAINER_H_

#include "strata/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct strata_trainer strata_trainer;

/* What one step takes: grad_accum micro-batches of batch x seq tokens, each
 * token and target in [0, vocab). */
typedef struct strata_shape {
  size_t struct_size; /* sizeof(strata_shape): STRATA_SHAPE_INIT */
  int64_t grad_accum;
  int64_t batch;
  int64_t seq;
  int64_t vocab;
} strata_shape;


/*
 * Creates a trainer from `config_json` (the text of a config). The planner
 * places weights, optimizer states, gradients and saved activations: the fastest
 * placement that fits the config's budgets within its constraints (NVMe is a
 * tier only when the config names nvme_paths or a DeepSpeed nvme_path;
 * budgets not given default to a 1 GiB device and half the RAM). `device`:
 * "host" (or NULL) for the host backend, "cuda" for the first CUDA GPU.
 * Unknown config keys are not errors; strata_trainer_describe lists them.
 */
STRATA_API strata_status strata_trainer_create(const char* config_json, const char* device, strata_trainer** out);
/* Ends a trainer (NULL: nothing); waits for whatever it has in flight.
 * A failure of that work is lost: call strata_trainer_finalize first to
 * hear of it. */
STRATA_API void strata_trainer_destroy(strata_trainer* trainer);
/* Lands the work a trainer has in flight (the update of the last step with
 * the delayed update, the device's background tasks) and returns the
 * first failure among it. Blocks until that work is done. The trainer
 * stays usable. STRATA_CANCELLED after strata_trainer_abort. */
STRATA_API strata_status strata_trainer_finalize(strata_trainer* trainer);
/* Marks the trainer aborted: from then on every call on it but
 * strata_trainer_destroy, strata_trainer_shape, strata_trainer_steps_done,
 * strata_trainer_describe and strata_trainer_async_error returns
 * STRATA_CANCELLED and does nothing. A
 * call in progress on another thread finishes first. Any thread; does
 * not block. Use it to stop a trainer that another thread drives. */
STRATA_API strata_status strata_trainer_abort(strata_trainer* trainer);
/* Without waiting: the failure of the trainer's background work not yet
 * reported (the delayed update in flight, or the last one, which failed
 * and is begun again by the next step or finalize); STRATA_OK when there
 * is none. Any thread; does not block; changes nothing. */
STRATA_API strata_status strata_trainer_async_error(strata_trainer* trainer);

STRATA_API strata_status strata_trainer_shape(const strata_trainer* trainer, strata_shape* shape);

/*
 * One optimizer step on `count` tokens and as many targets (the next token
 * of each), row-major [grad_accum][batch][seq]; count must be
 * grad_accum * batch * seq. With tokens and targets both NULL (count 0) the
 * step takes the built-in synthetic stream instead. `loss` (optional)
 * receives the step's mean loss. STRATA_INVALID_ARGUMENT, with nothing
 * changed, for a wrong count or a token outside the vocabulary.
 */
STRATA_API strata_status strata_trainer_step(strata_trainer* trainer, const int32_t* tokens, const int32_t* targets,
                                             size_t count, float* loss);
/* Optimizer steps taken so far (restored by strata_trainer_load). */
STRATA_API int64_t strata_trainer_steps_done(const strata_trainer* trainer);

/* Writes <dir>/step-<n> (model.safetensors with GPT-2 names, the optimizer
 * states, trainer.json), atomically: a crash leaves the previous one whole. */
STRATA_API strata_status strata_trainer_save(strata_trainer* trainer, const char* dir);
/* Restores the latest checkpoint under `dir`; the config's model must match. */
STRATA_API strata_status strata_trainer_load(strata_trainer* trainer, const char* dir);
/* strata_trainer_create, then strata_trainer_load of `dir`, without the
 * initial weights and states the load would replace (no initial draws;
 * states on NVMe are written once, by the load). On an error *out is NULL. */
STRATA_API strata_status strata_trainer_resume(const char* config_json, const char* device, const char* dir,
                                               strata_trainer** out);

/*
 * A JSON object describing the trainer: "parameters", "placement" (the
 * planner's choice and why), "plan" (the printed estimate: bytes per tier,
 * time per link), "warnings" (the config's unknown or ignored keys),
 * "steps_done", and the last step's "last" counters (grad_norm, clipped,
 * skipped, loss_scale, h2d_bytes, d2h_bytes, nvme_read_bytes,
 * nvme_written_bytes, device_idle_fraction). Valid until the next call with
 * this trainer; NULL only when `trainer` is.
 */
STRATA_API const char* strata_trainer_describe(strata_trainer* trainer);

/*
 * The planner's estimate for a config without building anything: the
 * printed plan of its placement (as strata_trainer_create would choose it)
 * into `text` (capacity bytes, NUL-terminated, truncated when longer;
 * `text` may be NULL with capacity 0), its full length into *length
 * (optional), and into *fits (optional) 1 when it fits the budgets. When
 * nothing fits: STRATA_RESOURCE_EXHAUSTED, and the message names the nearest
 * placement and what it would need.
 */
STRATA_API strata_status strata_plan(const char* config_json, const char* device, char* text, size_t capacity,
                                     size_t* length, int* fits);

#ifdef __cplusplus
}
#endif

#endif /* STRATA_TRAINER_H_ */
