// From a parsed EngineConfig to what a Session takes, and the pieces of
// that translation every client of the config shares (the built-in GPT's
// trainer too): the optimizer, loss scaling, O_DIRECT mode, the host
// backend's default budgets.
#pragma once

#include <string>
#include <vector>

#include "cpu_optim/optimizer.h"
#include "engine/config.h"
#include "engine/loss_scaler.h"
#include "engine/plan.h"
#include "engine/session.h"
#include "io/swap_store.h"

namespace strata::engine {

// The config's Adam (or AdamW): optimizer.lr, betas, eps, weight_decay.
cpu_optim::AdamConfig adam_of(const EngineConfig& config);
// The config's dynamic loss scaling (fp16).
LossScaleOptions loss_scale_of(const EngineConfig& config);
// io.direct: "off", "prefer" or "require".
io::DirectMode direct_mode(const EngineConfig& config);

// What every run takes from a config, whoever drives the session (a model
// of the caller's, the built-in GPT's trainer): the optimizer (adam or
// adamw) and its schedule, clipping, precision and loss scaling,
// accumulation, the states' type and piece size, the gradient ring, the
// delayed update, the NUMA node, pinning, the NVMe paths and I/O keys —
// not where the views live or the budgets, which each driver places its
// own way. InvalidArgument naming the key for what no run takes.
Status take_config(const EngineConfig& config, SessionOptions* options);

// What a Session (a model of the caller's) takes from the same config: the
// optimizer (adam or adamw), clipping, precision (bf16 or fp16) and loss
// scaling, the states' type and piece size, budgets.device / host / nvme,
// the NVMe paths and I/O keys, pinning. Placement is the config's fixed
// one: the states on NVMe when offload_optimizer (or placement.states)
// says nvme, the weights too when offload_param (placement.weights) does
// (then the states go there as well); otherwise in RAM; the activation
// activations it is handed on NVMe when placement.activations says nvme,
// otherwise in RAM. The planner's
// choice is the built-in GPT's. InvalidArgument naming the key for what a
// session cannot run; speculate_in_ram with the states in RAM, the
// delayed update, the rate schedule, the NUMA node. A choice of the
// config's a session cannot honour (batch.vertical) is a warning on stderr
// and in `warnings` (optional), never dropped silently.
Result<SessionOptions> session_options(const EngineConfig& config, std::vector<std::string>* warnings = nullptr);

// The config's budgets with the host backend's defaults where one is 0: a
// 1 GiB device and half the machine's RAM. `defaulted` (optional) says
// whether any was filled in.
Budgets budgets_or_defaults(Budgets budgets, bool* defaulted = nullptr);

}  // namespace strata::engine
