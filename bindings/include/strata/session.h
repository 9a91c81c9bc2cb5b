/*
 * strata/session.h: the session, for a model of the caller's own.
 * Reference: docs/C_API_SESSION.md.
 */
#ifndef STRATA_SESSION_H_
#define STRATA_SESSION_H_

#include "strata/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The session: a model of the caller's own, trained by strata.
 *
 * The model registers its parameters as chunks (a name, an element count,
 * initial fp32 values) and runs its own forward and backward on the
 * device; strata owns every byte of model state — working weights (bf16,
 * fp16 or fp32), gradients, fp32 master weights and Adam states — keeps each where
 * the config puts it (device slots, host RAM, NVMe) and updates each chunk
 * on the CPU as soon as its gradient is submitted. A step:
 *
 *   strata_session_begin_step(s, 1.0f);
 *   for each use of chunk c (forward, then backward in reverse):
 *     strata_session_acquire(s, c, NULL, &w);   // w: c's weights on the device
 *     ... compute with w ...
 *     strata_session_release(s, c);
 *   per chunk once, in backward:
 *     strata_session_gradient_buffer(s, c, &g); // compute c's gradient into g
 *     strata_session_submit_gradient(s, c, NULL);
 *   strata_session_end_step(s, &verdict);       // the update is done
 *
 * The same calls, seed and data give the same bits on every placement. On
 * the host backend ("host") the device's memory is ordinary memory the
 * caller's C code reads and writes directly; its budget is the config's
 * budgets.device. The config is the one strata_trainer_create takes; a
 * session reads its optimizer (adam or adamw), gradient_accumulation_steps
 * (micro-batches a step: each chunk's gradient is submitted that many times
 * a step and strata adds them up in fp32 before the update), gradient_clipping,
 * precision (bf16, fp16 with its dynamic loss scaling, or fp32: the master
 * weights' own bits, kept in RAM between uses), states type,
 * budgets, nvme_paths, io and pin_memory keys, and puts the optimizer
 * states on NVMe when offload_optimizer (placement.states) says nvme and
 * the weights when offload_param (placement.weights) does.
 *
 * Misuse — an unknown chunk, a gradient submitted twice, a step ended with
 * gradients missing, acquiring a chunk whose gradient was submitted, any
 * call outside a step that needs one — returns an error and changes
 * nothing: the step stays open where it was. A session is driven by one
 * thread; strata_session_abort and strata_session_async_error may be
 * called from any.
 */
typedef struct strata_session strata_session;

/* What strata_session_end_step decided. */
typedef struct strata_step_verdict {
  size_t struct_size;  /* sizeof(strata_step_verdict): STRATA_STEP_VERDICT_INIT */
  int64_t step;        /* the step this is the verdict of: the one ended (with
                          delayed_update the one before it; 0: none yet) */
  double grad_norm;    /* global norm of the scaled gradients, before clipping */
  int clipped;         /* 1: every gradient was scaled by clip / grad_norm */
  int skipped;         /* 1: an inf/nan gradient; nothing was updated */
  int rolled_back;     /* 1: speculative updates were undone (and redone unless skipped) */
  double lr;           /* the learning rate of this step's update */
  double loss_scale;   /* fp16: the scale the next step's loss takes (1 for bf16) */
} strata_step_verdict;
#define STRATA_STEP_VERDICT_INIT {sizeof(strata_step_verdict), 0, 0, 0, 0, 0, 0, 0}

/* Fills `count` floats at `dst` with chunk `chunk`'s initial values;
 * returns 0, or non-zero to fail strata_session_start. */
typedef int (*strata_chunk_init_fn)(void* user, int64_t chunk, float* dst, int64_t count);

/* What the planner needs to know of a model of the caller's, per
 * micro-batch of `micro_batch` samples (strata_session_plan). */
typedef struct strata_model_plan {
  size_t struct_size;          /* sizeof(strata_model_plan): STRATA_MODEL_PLAN_INIT */
  const int64_t* chunk_counts; /* each chunk's element count, in registration order */
  size_t chunk_count;
  int resident_first;            /* 1: chunk 0 stays on the device (session.resident_first) */
  int64_t micro_batch;           /* samples per micro-batch (how the plan names it) */
  int64_t activations;           /* activations the model keeps for backward */
  int64_t activations_saved;     /* of them, those it hands the session when they go off the device */
  uint64_t activation_bytes;     /* each */
  int64_t activations_in_flight; /* device buffers it keeps for them when they go off the device */
  uint64_t device_bytes;         /* its other device memory: workspace, inputs, buffers */
  double flops;                  /* one micro-batch's forward and backward */
  /* Each chunk's working type ("bf16", "fp16", "fp32"; see
   * strata_session_set_chunk_dtype), or NULL: every chunk in the config's
   * precision. A model with chunks of a type of its own is planned with its
   * weights and gradients in RAM. */
  const char* const* chunk_dtypes;
} strata_model_plan;
#define STRATA_MODEL_PLAN_INIT {sizeof(strata_model_plan), NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL}

/* The fastest placement a session of `config_json` on `device` can run
 * `model` with within the config's budgets (placement keys the config
 * gives are kept). Into `text` (capacity bytes, NUL-terminated, truncated
 * when longer; NULL with capacity 0 to ask the length) a JSON object:
 * "config", the keys to merge into the session's config ("placement":
 * weights, states, activations — "device": the model keeps them —,
 * gradients; "session": prefetch_depth, resident_first; "speculate_in_ram"), "fits",
 * "device_bytes", "host_bytes", "nvme_bytes", "step_seconds" (predicted
 * at a PCIe 4 GPU server's default rates) and "plan" (the printed plan).
 * Its full length goes to *length (optional). Builds nothing; any thread.
 * STRATA_RESOURCE_EXHAUSTED when nothing fits (the message names the
 * nearest placement and what it would need); INVALID_ARGUMENT for a model
 * without chunks, with counts < 1 or a chunk type a session refuses. */
STRATA_API strata_status strata_session_plan(const char* config_json, const char* device,
                                             const strata_model_plan* model, char* text, size_t capacity,
                                             size_t* length);

/* Creates a session from `config_json` on `device` ("host" or NULL: the
 * host backend; "cuda": the first GPU). Blocks while the device opens.
 * *out is NULL on an error. */
STRATA_API strata_status strata_session_create(const char* config_json, const char* device, strata_session** out);
/* Ends a session (NULL: nothing), abandoning an open step; waits for its
 * background work. */
STRATA_API void strata_session_destroy(strata_session* session);
/* Registers a chunk of `count` parameters before strata_session_start;
 * its index (0, 1, ... in registration order) goes to *chunk (optional).
 * `initial`: `count` floats copied now, or NULL for zeros.
 * INVALID_ARGUMENT for a NULL, empty or repeated name or count < 1;
 * FAILED_PRECONDITION after start. */
STRATA_API strata_status strata_session_add_chunk(strata_session* session, const char* name, int64_t count,
                                                  const float* initial, int64_t* chunk);
/* The same with the values made by `init(user, chunk, dst, count)`, called
 * once during strata_session_start (no copy of a big model is kept). */
STRATA_API strata_status strata_session_add_chunk_fn(strata_session* session, const char* name, int64_t count,
                                                     strata_chunk_init_fn init, void* user, int64_t* chunk);
/* Chunk `chunk`'s working type before start: "bf16", "fp32", or "fp16" (an
 * fp16 session only); until set, the config's precision. Its weights
 * (strata_session_acquire) and gradient buffer then hold elements of that
 * type: a model's norms and biases in fp32 beside bf16 matrices, say. The
 * fp32 master weights and optimizer states are the same for every type.
 * Chunks of a type of their own keep their weights and gradients in RAM:
 * with placement.weights or placement.gradients "nvme", start is
 * FAILED_PRECONDITION naming the chunk. INVALID_ARGUMENT for an unknown
 * chunk or type; FAILED_PRECONDITION after start. */
STRATA_API strata_status strata_session_set_chunk_dtype(strata_session* session, int64_t chunk, const char* dtype);
/* Chunk `chunk`'s working type into *dtype: "bf16", "fp16" or "fp32" (a
 * static string). INVALID_ARGUMENT for an unknown chunk. Any thread. */
STRATA_API strata_status strata_session_chunk_dtype(const strata_session* session, int64_t chunk, const char** dtype);
/* Names a tensor of the model's inside chunk `chunk` before start: `ndim`
 * (1..8) dimensions `shape` (row-major) from element `offset` on.
 * Checkpoints save the chunk's weights as its tensors, by name, instead of
 * the chunk whole; elements no tensor covers (padding) are not saved and
 * load as zero. INVALID_ARGUMENT for a NULL, empty or used name, a bad
 * shape, a tensor past the chunk's end or overlapping another;
 * FAILED_PRECONDITION after start. */
STRATA_API strata_status strata_session_add_tensor(strata_session* session, int64_t chunk, const char* name,
                                                   int64_t offset, const int64_t* shape, int ndim);
/* Places every chunk (host buffers, NVMe files, device slots) and writes
 * its initial state; blocks until done. RESOURCE_EXHAUSTED naming the
 * budget when the placement does not fit. The first begin_step calls it
 * when the caller did not. */
STRATA_API strata_status strata_session_start(strata_session* session);
/* The learning rate of the next steps' updates (finite, >= 0). */
STRATA_API strata_status strata_session_set_lr(strata_session* session, double lr);
/* The order the model submits its chunks' gradients in: `count` chunk
 * indices, each chunk once (outside a step). The optimizer reads states
 * ahead in it; until set, the reverse of registration, and each step ends
 * by taking the order it saw. With the config's placement.gradients "nvme"
 * it is a contract: a gradient out of it (or a chunk's micro-batches not
 * one after another) is FAILED_PRECONDITION, changing nothing.
 * INVALID_ARGUMENT for anything but a permutation of the chunks. */
STRATA_API strata_status strata_session_set_gradient_order(strata_session* session, const int64_t* order,
                                                           int64_t count);
/* fp16: multiply the loss by this before backward; 1 for bf16. */
STRATA_API double strata_session_loss_scale(const strata_session* session);
/* fp16: the loss scale of the next steps, outside a step: a power of two in
 * [the config's fp16.min_loss_scale, 2^127]; the dynamic scaler goes on
 * from it. A bf16 or fp32 session takes only 1. INVALID_ARGUMENT for
 * another scale, FAILED_PRECONDITION inside a step; nothing changes on an
 * error. */
STRATA_API strata_status strata_session_set_loss_scale(strata_session* session, double scale);
/* Whether the working weights and gradients are fp16, into *is_fp16
 * (optional): 1 for fp16 (scale the loss by strata_session_loss_scale), 0
 * for bf16 or fp32 (2 or 4 bytes an element, as the config's precision
 * says). */
STRATA_API strata_status strata_session_precision(const strata_session* session, int* is_fp16);
/* Opens a step; every submitted gradient is multiplied by `grad_scale`
 * (finite, > 0; e.g. 1 / micro-batches) besides the fp16 loss scale. */
STRATA_API strata_status strata_session_begin_step(strata_session* session, float grad_scale);
/* Chunk `chunk`'s working weights on the device into *weights, valid until
 * strata_session_release. Blocks until they are there (prefetched in the
 * order the first step recorded). With a `stream` (a cudaStream_t, not
 * owned) it returns at once, the stream made to wait for the copy, and the
 * release after it frees the slot only after what the stream queued by
 * then (UNIMPLEMENTED on the host backend). RESOURCE_EXHAUSTED when every
 * weight slot is held. Acquired again while it is held (a weight used at
 * two points, a module called twice): the same weights, held until as many
 * releases, on the stream of the first acquire or none (INVALID_ARGUMENT
 * for another). Outside a step (evaluation): the weights as the last step
 * left them, read-only, until released; gradient calls stay refused, and
 * begin_step, save, load, read_master and finalize need every chunk
 * released. */
STRATA_API strata_status strata_session_acquire(strata_session* session, int64_t chunk, void* stream,
                                                const void** weights);
STRATA_API strata_status strata_session_release(strata_session* session, int64_t chunk);
/* Where to compute chunk `chunk`'s gradient on the device (count elements
 * of the working type; contents undefined). Two buffers are handed out in
 * turn: submit one before asking for the one after the next
 * (RESOURCE_EXHAUSTED). Asked again before the submit: the same buffer. */
STRATA_API strata_status strata_session_gradient_buffer(strata_session* session, int64_t chunk, void** gradient);
/* The chunk's gradient is final (the caller's compute into it has
 * finished): it is copied to the host and, on the step's last micro-batch
 * (gradient_accumulation_steps), handed to the optimizer; an earlier
 * micro-batch's is added into the chunk's fp32 sum, and the chunk may be
 * acquired and computed again. FAILED_PRECONDITION past the step's
 * micro-batches. With a `stream` the gradient is final once what the stream
 * queued by the call is done (the copy out waits for it on the device).
 * Does not wait for the update. */
STRATA_API strata_status strata_session_submit_gradient(strata_session* session, int64_t chunk, void* stream);
/* Ends the step once every chunk's gradient was submitted: waits for the
 * optimizer and writes the verdict to *verdict (optional). On an I/O
 * failure of the update the step is over and nothing of it applied. With
 * the config's delayed_update: waits for the previous step's update, whose
 * verdict it writes, and starts this step's without waiting for it (when
 * the previous one failed, this step is dropped and the next begin_step
 * begins the failed update again). */
STRATA_API strata_status strata_session_end_step(strata_session* session, strata_step_verdict* verdict);
/* Abandons the open step (the model's compute failed); nothing of it is
 * applied. STRATA_OK when no step is open; FAILED_PRECONDITION once every
 * chunk's gradient was submitted (the update is under way: end the step). */
STRATA_API strata_status strata_session_cancel_step(strata_session* session);
/* Saved activations off the device: save copies `bytes` from
 * `device_src` to host RAM (or NVMe when the config's placement.activations
 * says nvme) under `key` (the caller's name for it, a layer index say;
 * saving a key again replaces it) and returns once the device buffer may be
 * reused (to NVMe: the write still in flight; its failure is the next load's
 * or save's of the key, or finalize's); load copies them back into `device_dst` (the same `bytes`) and
 * returns once they are there. STRATA_NOT_FOUND for a key never saved,
 * STRATA_RESOURCE_EXHAUSTED past the host budget. Both block. */
STRATA_API strata_status strata_session_save_activation(strata_session* session, uint64_t key,
                                                        const void* device_src, size_t bytes);
STRATA_API strata_status strata_session_load_activation(strata_session* session, uint64_t key, void* device_dst,
                                                        size_t bytes);
/* Starts the load of `key` into `device_dst` without waiting (from NVMe
 * the read, then the copy, beside the caller's compute); the load of the
 * same key and buffer that follows waits only for what is left of it, and
 * reports a failed read. `device_dst` is being written until then. */
STRATA_API strata_status strata_session_prefetch_activation(strata_session* session, uint64_t key, void* device_dst,
                                                            size_t bytes);
/* The activation calls in a caller's stream order (`stream`: a
 * cudaStream_t, not owned; NULL: the blocking calls above; UNIMPLEMENTED
 * with a stream on the host backend). _save_activation_on returns at
 * once, the copy out queued after what the stream queued by the call;
 * `device_src` stays the session's until strata_session_activation_saved
 * makes a stream wait for that copy (INVALID_ARGUMENT without a stream,
 * NOT_FOUND for a key never saved). _load_ and _prefetch_activation_on
 * copy into `device_dst` after what the stream queued by the call (its
 * reads of the buffer); the load still returns once the bytes are there. */
STRATA_API strata_status strata_session_save_activation_on(strata_session* session, uint64_t key,
                                                           const void* device_src, size_t bytes, void* stream);
STRATA_API strata_status strata_session_activation_saved(strata_session* session, uint64_t key, void* stream);
STRATA_API strata_status strata_session_load_activation_on(strata_session* session, uint64_t key, void* device_dst,
                                                           size_t bytes, void* stream);
STRATA_API strata_status strata_session_prefetch_activation_on(strata_session* session, uint64_t key, void* device_dst,
                                                               size_t bytes, void* stream);
/* `bytes` of device memory from the same budget (the model's activations)
 * into *memory; give it back with strata_session_device_free. */
STRATA_API strata_status strata_session_device_alloc(strata_session* session, size_t bytes, void** memory);
STRATA_API strata_status strata_session_device_free(strata_session* session, void* memory);
/* Chunk `chunk`'s fp32 master weights into `dst` (`count` floats, the
 * chunk's size); outside a step. */
STRATA_API strata_status strata_session_read_master(strata_session* session, int64_t chunk, float* dst,
                                                    int64_t count);
/* Steps ended so far. */
STRATA_API int64_t strata_session_steps_done(const strata_session* session);
/* Outside a step: writes <dir>/step-<n> atomically (model.safetensors with
 * each chunk's working weights under its name, optimizer.safetensors with
 * its master weights and Adam states, a sealed session.json). Blocks until
 * it is on disk. */
STRATA_API strata_status strata_session_save(strata_session* session, const char* dir);
/* Outside a step: restores the latest checkpoint under `dir` into a session
 * with the same chunks (names, counts), precision and state type, after
 * verifying all of it; into a session not started yet it places the
 * chunks without their initial values (no init called, nothing initial
 * written: the load writes every byte once). A refused
 * checkpoint (STRATA_DATA_LOSS, STRATA_FAILED_PRECONDITION, naming the file
 * and what differs) changes nothing. The run continues bit for bit. */
STRATA_API strata_status strata_session_load(strata_session* session, const char* dir);
/* A JSON object: "chunks" (name, count), "placement" (where weights and
 * states live), "budgets", "steps_done", "counters" (h2d_bytes, d2h_bytes,
 * nvme_read_bytes, nvme_written_bytes, device_peak_bytes, host_bytes),
 * "warnings" (the config's unknown keys). Valid until the next call with
 * this session; NULL only when `session` is. */
STRATA_API const char* strata_session_describe(strata_session* session);
/* Lands the session's work in flight and returns its first failure;
 * FAILED_PRECONDITION during a step. */
STRATA_API strata_status strata_session_finalize(strata_session* session);
/* From any thread: every later call but destroy, describe, steps_done and
 * async_error returns STRATA_CANCELLED and does nothing. Does not block. */
STRATA_API strata_status strata_session_abort(strata_session* session);
/* Without waiting: a failure of background work not yet reported
 * (STRATA_CANCELLED after abort). Any thread. */
STRATA_API strata_status strata_session_async_error(strata_session* session);

#ifdef __cplusplus
}
#endif

#endif /* STRATA_SESSION_H_ */
