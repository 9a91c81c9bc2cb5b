#include "engine/plan.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "common/units.h"
#include "cpu_optim/dtype.h"
#include "engine/chunk_store.h"
#include "engine/host_count.h"

namespace strata::engine {
namespace {

struct Sizes {
  int64_t params = 0;         // parameters (unpadded)
  uint64_t padded = 0;        // elements of all chunks, padding included
  uint64_t c = 2;             // bytes of a low-precision element
  ModelActivations ckpt;      // one micro-batch's saved activations
};

Sizes sizes_of(const TrainSetup& s, const std::vector<int64_t>& chunk_elems) {
  Sizes z;
  z.params = s.model->parameters();
  for (int64_t n : chunk_elems) z.padded += static_cast<uint64_t>(n);
  z.c = dtype_bytes(s.compute);
  z.ckpt = s.model->activations(s.micro_batch, s.compute);
  return z;
}

}  // namespace

std::vector<DType> chunk_dtypes_of(const TrainSetup& s) {
  if (!s.chunk_dtypes.empty() || s.model == nullptr) return s.chunk_dtypes;
  return s.model->chunk_dtypes();
}

bool mixes_dtypes(const TrainSetup& s) {
  const std::vector<DType> types = chunk_dtypes_of(s);
  return std::any_of(types.begin(), types.end(), [&](DType t) { return t != s.working; });
}

bool gradients_run_on_nvme(const TrainSetup& s, Tier states, int64_t micro_batches_per_pass) {
  return states == Tier::kNvme && !s.delayed_update && (s.grad_accum == 1 || micro_batches_per_pass == s.grad_accum);
}

Status check_placement(const TrainSetup& s, const Placement& pl) {
  const std::string_view st = tier_name(pl.states);
  if (pl.states == Tier::kDevice) {
    return invalid_argument("the optimizer states live on the host or on NVMe (the optimizer runs on the CPU)");
  }
  if (pl.weights == Tier::kNvme && pl.states != Tier::kNvme) {
    return invalid_argument(
        "weights on NVMe need the optimizer states on NVMe (their blobs share the states' "
        "pieces); the states are on " +
        std::string(st));
  }
  if (mixes_dtypes(s) && (pl.weights == Tier::kNvme || pl.gradients == Tier::kNvme)) {
    return invalid_argument(std::string("chunks of a working type of their own keep their weights and gradients in ") +
                            "RAM: the " + (pl.weights == Tier::kNvme ? "weights" : "gradients") +
                            " cannot go on NVMe (placement." + (pl.weights == Tier::kNvme ? "weights" : "gradients") +
                            " host)");
  }
  if (pl.weights == Tier::kNvme && s.working == DType::kF32) {
    return invalid_argument("fp32 working weights stay in RAM between uses (weights on NVMe are bf16 or fp16)");
  }
  if (pl.activations != Tier::kDevice && pl.weights == Tier::kDevice) {
    return invalid_argument(
        "saved activations off the device need the weights streamed (weights on the host "
        "or on NVMe between uses); they are resident on the device");
  }
  if (pl.speculate_in_ram && pl.states != Tier::kHost) {
    return invalid_argument(
        "speculate_in_ram is for optimizer states in RAM (on NVMe, speculation keeps its "
        "second copy there: `speculate`); the states are on " +
        std::string(st));
  }
  if (pl.gradients != Tier::kHost && pl.gradients != Tier::kNvme) {
    return invalid_argument("the gradients wait for the optimizer on the host or on NVMe");
  }
  if (pl.gradients == Tier::kNvme && !gradients_run_on_nvme(s, pl.states, pl.micro_batches_per_pass)) {
    return invalid_argument(
        "gradients on NVMe need the optimizer states on NVMe, the exact schedule (no delayed update) and each "
        "chunk's micro-batches landing one after another (grad_accum 1, or all of them in one pass); got states on " +
        std::string(st) + ", grad_accum " + std::to_string(s.grad_accum) +
        (s.grad_accum <= 1                ? std::string()
         : pl.micro_batches_per_pass == 1 ? std::string(" one micro-batch at a time")
                                          : " in passes of " + std::to_string(pl.micro_batches_per_pass)) +
        (s.delayed_update ? ", the delayed update" : ""));
  }
  if (pl.micro_batches_per_pass < 1 || s.grad_accum % pl.micro_batches_per_pass != 0) {
    return invalid_argument("micro-batches per pass must divide grad_accum (" + std::to_string(s.grad_accum) +
                            "), got " + std::to_string(pl.micro_batches_per_pass));
  }
  if (pl.prefetch_depth < 1 || pl.prefetch_depth > 1024) {
    return invalid_argument("prefetch_depth must be 1..1024, got " + std::to_string(pl.prefetch_depth));
  }
  return ok_status();
}

std::string placement_text(const Placement& pl) {
  return "weights on " + std::string(tier_name(pl.weights)) + ", optimizer states on " +
         std::string(tier_name(pl.states)) +
         (pl.speculate_in_ram ? " with a second copy (speculate_in_ram: updates as gradients land)" : "") +
         ", activations on " + std::string(tier_name(pl.activations)) +
         (pl.micro_batches_per_pass > 1 ? ", " + std::to_string(pl.micro_batches_per_pass) +
                                              " micro-batches of a block at once (vertical accumulation)"
                                        : std::string()) +
         (pl.gradients == Tier::kNvme ? ", gradients on nvme" : "");
}

namespace {

// estimate()'s inputs, derived once, for its parts below.
struct Counting {
  const TrainSetup& s;
  const Placement& pl;
  const std::vector<int64_t>& layout;  // the model's chunk_elems()
  Sizes z;
  double state_bytes = 0;  // per parameter: the fp32 master weights, m and v
  // Micro-batches per pass of the streamed model: a group of them (all, or
  // a divisor of grad_accum) in the vertical order — their block inputs,
  // block gradients and embedding gradients on the device at once — else one.
  uint64_t V = 1;
  double passes = 1;  // per step: grad_accum / V
  uint64_t w = 2;     // bytes of a working weight
  bool grads_nvme = false;
  // What the optimizer reads per parameter of gradient (on NVMe, or in a
  // delayed update's second set).
  uint64_t opt_grad_bytes = 2;
  // A pass's block input l is its V micro-batches' inputs side by side: one
  // copy, one NVMe blob (the GPT's save_activation).
  uint64_t ckpt_group_bytes = 0;
  // Each chunk's type where they differ (chunk_dtypes_of; empty: all
  // s.compute), its bytes of an element, and the model's weights in them:
  // P x c (unpadded) when every chunk has one type.
  std::vector<DType> chunk_dtypes;
  std::vector<uint64_t> chunk_c;
  double weights_bytes = 0;
  double bytes_of(size_t chunk, double elems) const { return elems * static_cast<double>(chunk_c[chunk]); }
};

// NVMe blocks and pinned buffers.
uint64_t padded(uint64_t bytes) {
  return round_up(bytes, uint64_t{4096});
}

// Device: what the session's chunk store allocates (chunk_store_bytes) and
// what the model says it does (PlanModel::device_bytes), each counted by
// the function its allocator sizes itself with. Resident weights are a
// store whose depth holds every chunk; streamed, its weight slots are the
// chunk buffers. Where the model keeps chunk 0 resident (the session's
// resident_first) it stays with its gradients. Tests hold the count to
// what a run measures, for the built-in GPT and for a model of a test's.
void count_device(const Counting& k, Plan& p) {
  const TrainSetup& s = k.s;
  const Placement& pl = k.pl;
  const bool resident = pl.weights == Tier::kDevice;
  ChunkStoreOptions so;
  so.resident_first = s.model->resident_first();
  const auto slotted = static_cast<int>(k.layout.size()) - (so.resident_first ? 1 : 0);
  so.prefetch_depth = resident ? slotted - 1 : pl.prefetch_depth;
  so.dtype = s.compute;
  so.chunk_dtypes = k.chunk_dtypes;
  const ChunkStoreBytes store = chunk_store_bytes(k.layout, so);
  ModelPass pass;
  pass.micro_batch = s.micro_batch;
  pass.pass = static_cast<int64_t>(k.V);
  pass.grad_accum = s.grad_accum;
  pass.compute = s.compute;
  pass.host_backend = s.host_backend;
  pass.offload_activations = pl.activations != Tier::kDevice;
  const ModelDeviceBytes model = s.model->device_bytes(pass);
  if (resident) {
    p.device.model_states += store.slots() + store.resident;
    p.device.buffers += store.gradient_slot_bytes() + store.resident_gradients + model.resident;
  } else {
    p.device_chunk_buffers = store.weight_slots;
    p.device.buffers += store.slots() + store.gradient_slot_bytes();
    p.device.model_states += store.resident + store.resident_gradients + model.resident;
  }
  p.device.activations += model.working_set + model.activations_kept;
  p.device.io_buffers += model.step;
  // Offloaded, the activations the model saves go to the session's tier,
  // a pass's micro-batches side by side (one NVMe blob each).
  const auto saved = static_cast<uint64_t>(k.z.ckpt.saved);
  if (pl.activations == Tier::kNvme) p.nvme.activations += saved * padded(k.ckpt_group_bytes);
  if (pl.activations == Tier::kHost) p.host.activations += saved * k.ckpt_group_bytes;
}

// The bytes of one NVMe blob per piece of every chunk at `bytes_per_param`:
// each takes whole 4 KiB blocks. Chunks come in runs of one size: each
// size's pieces are counted once, times its chunks.
uint64_t blob_bytes(const Counting& k, double bytes_per_param) {
  uint64_t total = 0;
  for (size_t i = 0; i < k.layout.size();) {
    const int64_t n = k.layout[i];
    uint64_t count = 0;
    for (; i < k.layout.size() && k.layout[i] == n; ++i) ++count;
    uint64_t one = 0;
    for (int64_t piece : state_piece_sizes(n, k.s.state_piece_elems)) {
      one += padded(static_cast<uint64_t>(static_cast<double>(piece) * bytes_per_param));
    }
    total += one * count;
  }
  return total;
}

// Host and NVMe: gradients land in host memory in the compute type (their
// fp32 sum too when accumulating over micro-batches; a delayed update keeps
// a second set of whichever of the two the optimizer reads). Weights on the
// host: the ones the device computes with and the buffer the optimizer
// writes the next ones into. On NVMe, states and weights have two
// generations (an update is written beside the old state and switched to at
// the step's verdict). This is what the session (engine/session.cpp) and
// the GPT on it allocate; a test holds the two within 5%.
void count_host_and_nvme(const Counting& k, Plan& p) {
  const TrainSetup& s = k.s;
  const Placement& pl = k.pl;
  // The host: what the session allocates for its chunks, by its own count
  // (host_count.h), with each I/O buffer in whole pages.
  HostCountInput in;
  in.chunk_elems = k.layout;
  in.element_bytes = k.w;
  if (!k.chunk_dtypes.empty()) in.chunk_element_bytes = k.chunk_c;
  in.grad_accum = s.grad_accum;
  in.delayed_update = s.delayed_update;
  in.weights = pl.weights == Tier::kNvme ? Tier::kNvme : Tier::kHost;
  in.states = pl.states;
  in.speculate_in_ram = pl.speculate_in_ram && pl.states == Tier::kHost;
  in.gradients_on_nvme = k.grads_nvme;
  in.gradient_buffers = s.gradient_buffers;
  in.staging_buffers = kStateStagingBuffers;
  in.prefetch_depth = pl.prefetch_depth;
  in.state_piece_elems = s.state_piece_elems;
  in.state_bytes = [per = k.state_bytes](int64_t n) { return static_cast<uint64_t>(static_cast<double>(n) * per); };
  in.pad = padded;
  const HostCount host = count_host_bytes(in);
  p.host.model_states += host.model_states;
  p.host.io_buffers += host.io_buffers;
  // NVMe: two generations of the weights' and states' blobs (an update is
  // written beside the old one), a scratch blob per piece for gradients.
  if (pl.weights == Tier::kNvme) p.nvme.model_states += 2 * blob_bytes(k, static_cast<double>(k.w));
  if (k.grads_nvme) p.nvme.model_states += blob_bytes(k, static_cast<double>(k.opt_grad_bytes));
  if (pl.states == Tier::kNvme) {
    p.nvme.model_states += 2 * blob_bytes(k, k.state_bytes);
  } else if (pl.states == Tier::kDevice) {
    // Not a placement the engine runs (check_placement), but estimate() counts any.
    const auto state_total = static_cast<uint64_t>(static_cast<double>(k.z.padded) * k.state_bytes);
    p.device.model_states += (pl.speculate_in_ram ? 2 : 1) * state_total;
  }
  // The GPT's activation staging beside the session's.
  if (pl.activations == Tier::kNvme) p.host.io_buffers += kActivationStagingBuffers * padded(k.ckpt_group_bytes);
}

// Bytes to the device per step. Per pass of the streamed model (each
// micro-batch, or once per step in the vertical order). Resident: every
// chunk goes up once a step (later micro-batches find them on the device).
// Streamed: a resident chunk 0 once; the chunks through the slots (the
// rest, in order) twice, less those still in a slot when backward turns
// around — the last depth + 1 of forward, which the chunk store keeps as
// the ones used again soonest. A later pass of the same step also finds
// what backward left in the slots: its last depth + 1 chunks, the first of
// forward.
double weight_bytes_up(const Counting& k) {
  if (k.pl.weights == Tier::kDevice) return k.weights_bytes;
  const std::vector<int64_t>& layout = k.layout;
  const size_t from = k.s.model->resident_first() ? 1 : 0;
  const auto slotted = static_cast<int64_t>(layout.size() - from);
  const int64_t kept = std::min<int64_t>(k.pl.prefetch_depth + 1, slotted);
  double held = 0, left = 0;
  for (int64_t i = 0; i < kept; ++i) {
    const size_t last = from + static_cast<size_t>(slotted - 1 - i), next = from + static_cast<size_t>(i);
    held += k.bytes_of(last, static_cast<double>(layout[last]));
    left += k.bytes_of(next, static_cast<double>(layout[next]));
  }
  const double resident = from == 1 ? k.bytes_of(0, static_cast<double>(layout[0])) : 0.0;
  const double first = resident + 2 * (k.weights_bytes - resident) - held;
  return first + (k.passes - 1) * std::max(first - resident - left, 0.0);
}

// Every link's bytes (or FLOPs) per optimizer step and their time alone.
void count_links(const Counting& k, const Bandwidths& bw, Plan& p) {
  const TrainSetup& s = k.s;
  const Placement& pl = k.pl;
  const double P = static_cast<double>(k.z.params);
  // The activations the model saves go down and come back once each.
  const double ckpt = static_cast<double>(k.z.ckpt.saved) * static_cast<double>(k.z.ckpt.bytes);
  const double A = static_cast<double>(s.grad_accum);
  double h2d = weight_bytes_up(k);
  double d2h = k.weights_bytes * A;
  if (pl.activations != Tier::kDevice) {
    h2d += ckpt * A;
    d2h += ckpt * A;
  }
  double nvme_read = 0, nvme_write = 0;
  if (pl.states == Tier::kNvme) {
    nvme_read += P * k.state_bytes;
    nvme_write += P * k.state_bytes;
  }
  if (pl.weights == Tier::kNvme) {
    const double wb = static_cast<double>(k.w);
    nvme_read += 2 * P * wb * k.passes;  // forward and backward each read every chunk, every pass
    nvme_write += P * wb;
  }
  if (pl.activations == Tier::kNvme) {
    nvme_read += ckpt * A;
    nvme_write += ckpt * A;
  }
  // Gradients on NVMe are written as they land; a step whose speculative
  // update holds (the one predicted here) does not read them back — one
  // that clips, or follows one that clipped or skipped, reads them too.
  if (k.grads_nvme) nvme_write += P * static_cast<double>(k.opt_grad_bytes);
  const double flops = s.model->flops(s.micro_batch) * A;
  p.links = {
      {"compute", flops, flops / (bw.device_tflops * 1e12)},
      {"host->device", h2d, h2d / (bw.h2d_gbps * 1e9)},
      {"device->host", d2h, d2h / (bw.d2h_gbps * 1e9)},
      {"cpu optimizer", P * (8 + k.state_bytes + k.weights_bytes / P), P / bw.cpu_optimizer_params_per_s},
      {"nvme read", nvme_read, nvme_read / (bw.nvme_read_gbps * 1e9)},
      {"nvme write", nvme_write, nvme_write / (bw.nvme_write_gbps * 1e9)},
  };
}

// The step time from the links: what overlaps, and what an exact step
// cannot overlap. The chunks whose gradients land last (the first block's,
// then the embeddings') are updated after backward ends, and on NVMe their
// new states (and weights) are written back before the verdict; with states
// in RAM every update waits for the verdict (the global gradient norm: RAM
// holds no old generation to roll back to) unless a second copy of the
// states is kept, so the whole optimizer pass follows backward. The next
// forward then begins by copying the new weights of those same chunks up.
void time_step(const Counting& k, const Bandwidths& bw, Plan& p) {
  const Placement& pl = k.pl;
  const std::vector<int64_t>& layout = k.layout;
  const double P = static_cast<double>(k.z.params);
  const int64_t piece_elems = k.s.state_piece_elems;
  const double last = static_cast<double>(layout[0]) + (layout.size() > 2 ? static_cast<double>(layout[1]) : 0.0);
  const bool speculates = pl.states == Tier::kNvme || pl.speculate_in_ram;
  p.tail_seconds = (speculates ? last : P) / bw.cpu_optimizer_params_per_s;
  if (pl.states == Tier::kNvme) {
    // Their pieces' updates and writes overlap one another but the last
    // piece's: the slower of the two over `last`, plus the faster over one piece.
    // Working weights and gradients too, when homed there.
    const double weights = (pl.weights == Tier::kNvme ? static_cast<double>(k.w) : 0.0) +
                           (k.grads_nvme ? static_cast<double>(k.opt_grad_bytes) : 0.0);
    const double update = p.tail_seconds;
    const double write = last * (k.state_bytes + weights) / (bw.nvme_write_gbps * 1e9);
    double unit = static_cast<double>(state_piece_sizes(layout[0], piece_elems)[0]);
    if (layout.size() > 2) unit = std::max(unit, static_cast<double>(state_piece_sizes(layout[1], piece_elems)[0]));
    p.tail_seconds = std::max(update, write) + std::min(update, write) * unit / last;  // unit <= last
  }
  const double last_bytes = k.bytes_of(0, static_cast<double>(layout[0])) +
                            (layout.size() > 2 ? k.bytes_of(1, static_cast<double>(layout[1])) : 0.0);
  p.head_seconds = last_bytes / (bw.h2d_gbps * 1e9);
  // Reads and writes go to the same drives and share their bandwidth (each
  // rate was measured alone): together they take the sum of their times.
  double nvme_seconds = 0;
  for (const LinkTime& l : p.links) {
    if (l.link.rfind("nvme", 0) == 0) nvme_seconds += l.seconds;
  }
  p.overlapped_seconds = nvme_seconds;
  if (bw.shares_host_cores) {
    // Compute, copies and the optimizer run one after another on the same
    // cores; NVMe transfers overlap all of them but the last chunks' writes.
    double cores = 0;
    for (const LinkTime& l : p.links) {
      if (l.link.rfind("nvme", 0) != 0) cores += l.seconds;
    }
    p.head_seconds = 0;
    p.tail_seconds = std::max(0.0, p.tail_seconds - (speculates ? last : P) / bw.cpu_optimizer_params_per_s);
    p.overlapped_seconds = std::max(p.overlapped_seconds, cores);
    p.step_seconds = p.overlapped_seconds + p.tail_seconds;
    return;
  }
  for (const LinkTime& l : p.links) {
    if (l.link == "cpu optimizer" && !speculates) continue;  // all of it in the tail
    if (l.link.rfind("nvme", 0) == 0) continue;                // counted together above
    p.overlapped_seconds = std::max(p.overlapped_seconds, l.seconds);
  }
  p.step_seconds = p.overlapped_seconds + p.head_seconds + p.tail_seconds;
}

}  // namespace

Plan estimate(const TrainSetup& s, const Placement& pl, const Bandwidths& bw) {
  Counting k{s, pl, s.model->chunk_elems(), {}};
  k.z = sizes_of(s, k.layout);
  k.state_bytes = 4.0 + s.state_bytes_per_param;
  k.V = static_cast<uint64_t>(std::max<int64_t>(std::max(pl.micro_batches_per_pass, s.micro_batches_per_pass), 1));
  k.passes = static_cast<double>(s.grad_accum) / static_cast<double>(k.V);
  k.w = dtype_bytes(s.working);
  k.grads_nvme = pl.gradients == Tier::kNvme;
  k.opt_grad_bytes = dtype_bytes(optimizer_gradient_type(s));
  k.ckpt_group_bytes = k.V * k.z.ckpt.bytes;
  k.chunk_c.assign(k.layout.size(), k.z.c);
  if (mixes_dtypes(s)) {
    k.chunk_dtypes = chunk_dtypes_of(s);
    double bytes = 0;
    for (size_t c = 0; c < k.layout.size(); ++c) {
      k.chunk_c[c] = dtype_bytes(k.chunk_dtypes.at(c));
      bytes += k.bytes_of(c, static_cast<double>(k.layout[c]));
    }
    // Padding (none in a session's own chunks) in the chunks' average type.
    k.weights_bytes = bytes * static_cast<double>(k.z.params) / static_cast<double>(k.z.padded);
  } else {
    k.weights_bytes = static_cast<double>(k.z.params) * static_cast<double>(k.z.c);
  }
  Plan p;
  p.setup = s;
  p.placement = pl;
  p.bandwidths = bw;
  p.parameters = k.z.params;
  count_device(k, p);
  count_host_and_nvme(k, p);
  count_links(k, bw, p);
  time_step(k, bw, p);
  return p;
}

bool fits(const Plan& p, const Budgets& b) {
  return p.device.total() <= b.device_bytes && p.host.total() <= b.host_bytes && p.nvme.total() <= b.nvme_bytes;
}

namespace {

// How far over its budget the worst tier is (1 = exactly full).
double overflow(const Plan& p, const Budgets& b) {
  auto ratio = [](uint64_t need, uint64_t have) {
    if (need == 0) return 0.0;
    return have == 0 ? std::numeric_limits<double>::infinity() : static_cast<double>(need) / static_cast<double>(have);
  };
  return std::max({ratio(p.device.total(), b.device_bytes), ratio(p.host.total(), b.host_bytes),
                   ratio(p.nvme.total(), b.nvme_bytes)});
}

std::vector<Placement> candidates(const Budgets& b, const Constraints& fixed) {
  std::vector<Tier> tiers = {Tier::kDevice, Tier::kHost};
  if (b.nvme_bytes > 0) tiers.push_back(Tier::kNvme);
  auto allowed = [](const std::optional<Tier>& want, Tier t) { return !want || *want == t; };
  std::vector<Placement> out;
  // Every combination of the tiers the constraints allow; runnable()
  // keeps those check_placement accepts.
  for (Tier w : tiers) {
    if (!allowed(fixed.weights, w)) continue;
    for (Tier st : tiers) {
      if (!allowed(fixed.states, st)) continue;
      for (Tier ck : tiers) {
        if (!allowed(fixed.activations, ck)) continue;
        // Prefetch depths only matter when the weights stream.
        for (int k = 1; k <= (w == Tier::kDevice ? 1 : 4); ++k) {
          for (Tier g : {Tier::kHost, Tier::kNvme}) {
            if (!allowed(fixed.gradients, g)) continue;
            Placement pl{w, st, ck, k};
            pl.gradients = g;
            out.push_back(pl);
            // A second copy of the states, so chunks update as their
            // gradients land instead of after backward (more host memory).
            if (fixed.allow_speculate_in_ram) {
              pl.speculate_in_ram = true;
              out.push_back(pl);
            }
          }
        }
      }
    }
  }
  return out;
}

// The vertical order's group sizes (micro-batches per pass) worth
// planning: the one asked for (then the only order), or the divisors of
// grad_accum above 1 (found in pairs up to the square root: grad_accum may
// be 2^20).
std::vector<int64_t> vertical_groups(const TrainSetup& s) {
  if (s.micro_batches_per_pass > 1) return {s.micro_batches_per_pass};
  std::vector<int64_t> groups;
  for (int64_t v = 1; v * v <= s.grad_accum; ++v) {
    if (s.grad_accum % v != 0) continue;
    if (v > 1) groups.push_back(v);
    if (s.grad_accum / v != v) groups.push_back(s.grad_accum / v);
  }
  std::sort(groups.begin(), groups.end());
  return groups;
}

// Every placement the trainer runs for `s`, with its group size: the
// candidates in one micro-batch at a time (unless a group is asked for) and
// in each of `groups`.
std::vector<Placement> runnable(const TrainSetup& s, const Budgets& b, const Constraints& fixed,
                                const std::vector<int64_t>& groups) {
  std::vector<Placement> all;
  auto runs = [&](const Placement& pl) { return check_placement(s, pl).ok(); };
  for (Placement pl : candidates(b, fixed)) {
    if (s.micro_batches_per_pass <= 1 && runs(pl)) all.push_back(pl);
    for (int64_t v : groups) {
      pl.micro_batches_per_pass = v;
      if (runs(pl)) all.push_back(pl);
    }
  }
  return all;
}

// Searches the placements for `setup`; false when none fits.
bool best_plan(const TrainSetup& s, const Budgets& b, const Bandwidths& bw, const Constraints& fixed, Plan* best,
               Plan* closest) {
  bool found = false, have_closest = false;
  double closest_over = std::numeric_limits<double>::infinity();
  for (const Placement& pl : runnable(s, b, fixed, vertical_groups(s))) {
    Plan p = estimate(s, pl, bw);
    if (fits(p, b)) {
      // Strictly faster wins; the enumeration order prefers faster tiers,
      // shallower prefetch and smaller groups on ties.
      if (!found || p.step_seconds < best->step_seconds * (1 - 1e-9)) {
        *best = p;
        found = true;
      }
    } else if (closest != nullptr && (overflow(p, b) < closest_over || !have_closest)) {
      have_closest = true;
      closest_over = overflow(p, b);
      *closest = p;
    }
  }
  return found;
}

// Whether any placement of `s` fits, stopping at the first that does. A
// larger group holds more on every tier (its micro-batches' inputs side
// by side), so of the groups only the smallest can fit where another does,
// and all of them, which alone lets the gradients wait on NVMe.
bool any_fits(const TrainSetup& s, const Budgets& b, const Bandwidths& bw, const Constraints& fixed) {
  std::vector<int64_t> groups = vertical_groups(s);
  if (groups.size() > 2) groups = {groups.front(), groups.back()};
  for (const Placement& pl : runnable(s, b, fixed, groups)) {
    if (fits(estimate(s, pl, bw), b)) return true;
  }
  return false;
}

std::string shortfalls(const Plan& p, const Budgets& b) {
  std::string out;
  auto add = [&](const char* name, uint64_t need, uint64_t have) {
    if (need <= have) return;
    if (!out.empty()) out += "; ";
    out += std::string(name) + " needs " + format_bytes(need) + " (budget " + format_bytes(have) + ")";
  };
  add("device", p.device.total(), b.device_bytes);
  add("host", p.host.total(), b.host_bytes);
  add("nvme", p.nvme.total(), b.nvme_bytes);
  return out;
}

// Whether some placement of `s` at this micro-batch and Adam state size fits.
bool fits_with(const TrainSetup& s, const Budgets& b, const Bandwidths& bw, const Constraints& fixed,
               int64_t micro_batch, double state_bytes) {
  TrainSetup t = s;
  t.micro_batch = micro_batch;
  t.state_bytes_per_param = state_bytes;
  return any_fits(t, b, bw, fixed);
}

// The largest micro-batch below `below` that fits with `state_bytes` Adam
// states, or 0 when not even 1 does. Every tier's bytes grow with the
// micro-batch (working set, workspace, saved activations), so what fits is a
// prefix 1..m and bisection finds m in log2(below) searches: the planner
// answers a micro-batch of 2^20 as fast as one of 8.
int64_t largest_fitting_micro_batch(const TrainSetup& s, const Budgets& b, const Bandwidths& bw,
                                    const Constraints& fixed, int64_t below, double state_bytes) {
  if (below <= 1 || !fits_with(s, b, bw, fixed, 1, state_bytes)) return 0;
  int64_t lo = 1, hi = below;  // lo fits; hi does not (or is the bound)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits_with(s, b, bw, fixed, mid, state_bytes) ? lo : hi) = mid;
  }
  return lo;
}

// The nearest setup that fits when `s` does not, in order of the least
// change to the run: a smaller micro-batch; smaller Adam states (bf16, then
// 8-bit) at this micro-batch; then both. Empty when none does.
std::string nearest_fitting(const TrainSetup& s, const Budgets& b, const Bandwidths& bw, const Constraints& fixed) {
  if (const int64_t mb = largest_fitting_micro_batch(s, b, bw, fixed, s.micro_batch, s.state_bytes_per_param)) {
    return "micro-batch " + std::to_string(mb) + " would fit";
  }
  std::vector<cpu_optim::StateType> smaller;  // than the states asked for
  for (cpu_optim::StateType t : {cpu_optim::StateType::kBF16, cpu_optim::StateType::kQ8}) {
    if (cpu_optim::adam_state_bytes_per_param(t) < s.state_bytes_per_param) smaller.push_back(t);
  }
  auto states_text = [](cpu_optim::StateType t) {
    return "Adam states in " + std::string(cpu_optim::state_type_name(t)) + " (config \"states\")";
  };
  for (cpu_optim::StateType t : smaller) {
    const double bytes = cpu_optim::adam_state_bytes_per_param(t);
    if (fits_with(s, b, bw, fixed, s.micro_batch, bytes)) return states_text(t) + " would fit";
  }
  for (cpu_optim::StateType t : smaller) {
    const double bytes = cpu_optim::adam_state_bytes_per_param(t);
    if (const int64_t mb = largest_fitting_micro_batch(s, b, bw, fixed, s.micro_batch, bytes)) {
      return "micro-batch " + std::to_string(mb) + " with " + states_text(t) + " would fit";
    }
  }
  return "";
}

// The link that bounds the step; NVMe's reads and writes count as one
// (they share the drives).
std::string slowest_link(const Plan& p) {
  std::string name = "compute";
  double slowest = -1, nvme = 0;
  for (const LinkTime& l : p.links) {
    if (l.link.rfind("nvme", 0) == 0) {
      nvme += l.seconds;
    } else if (l.seconds > slowest) {
      slowest = l.seconds;
      name = l.link;
    }
  }
  return nvme > slowest ? "nvme reads + writes" : name;
}

}  // namespace

Result<Plan> make_plan(const TrainSetup& s, const Budgets& b, const Bandwidths& bw, const Constraints& fixed) {
  if (s.model == nullptr) return invalid_argument("training setup: no model to plan");
  STRATA_RETURN_IF_ERROR(s.model->check(s.micro_batch));
  if (s.model->chunk_elems().size() < (s.model->resident_first() ? 2u : 1u)) {
    return invalid_argument(
        "training setup: the model has no chunks to stream (a resident first chunk needs one more)");
  }
  if (s.grad_accum < 1) return invalid_argument("training setup: grad_accum >= 1 required");
  if (const size_t types = chunk_dtypes_of(s).size(); types != 0 && types != s.model->chunk_elems().size()) {
    return invalid_argument("training setup: " + std::to_string(types) + " chunk types for " +
                            std::to_string(s.model->chunk_elems().size()) + " chunks");
  }
  STRATA_RETURN_IF_ERROR(check_state_piece_elems(s.state_piece_elems).with_context("training setup"));
  if ((fixed.weights == Tier::kNvme || fixed.states == Tier::kNvme || fixed.activations == Tier::kNvme) &&
      b.nvme_bytes == 0) {
    return invalid_argument("the configuration puts data on NVMe but gives no NVMe budget (or path)");
  }
  if (fixed.states == Tier::kDevice) {
    return invalid_argument("optimizer states cannot live on the device: the optimizer runs on the CPU");
  }
  Plan best, closest;
  if (best_plan(s, b, bw, fixed, &best, &closest)) {
    best.why = placement_text(best.placement) +
               (best.device_chunk_buffers > 0 ? ", prefetch depth " + std::to_string(best.placement.prefetch_depth)
                                              : std::string()) +
               ": the fastest placement that fits (slowest link: " + slowest_link(best) + ")";
    return best;
  }
  std::string message = "no placement of " + std::to_string(s.model->parameters()) + " parameters fits: the closest (" +
                        placement_text(closest.placement) + ") " + shortfalls(closest, b);
  const std::string nearest = nearest_fitting(s, b, bw, fixed);
  if (!nearest.empty()) message += "; " + nearest;
  return resource_exhausted(message);
}

std::string format_plan(const Plan& p, const Budgets& b) {
  char line[256];
  std::string out;
  out += "plan: " + std::to_string(p.parameters) + " parameters, " +
         p.setup.model->micro_batch_text(p.setup.micro_batch) + ", " + std::to_string(p.setup.grad_accum) +
         " accumulation steps\n";
  out += "  " + p.why + "\n";
  std::snprintf(line, sizeof(line), "  %-7s %12s %12s %12s %12s %12s %12s\n", "tier", "states", "activations",
                "buffers", "io buffers", "total", "budget");
  out += line;
  auto row = [&](const char* name, const TierBytes& t, uint64_t budget) {
    std::snprintf(line, sizeof(line), "  %-7s %12s %12s %12s %12s %12s %12s\n", name,
                  format_bytes(t.model_states).c_str(), format_bytes(t.activations).c_str(),
                  format_bytes(t.buffers).c_str(), format_bytes(t.io_buffers).c_str(), format_bytes(t.total()).c_str(),
                  format_bytes(budget).c_str());
    out += line;
  };
  row("device", p.device, b.device_bytes);
  row("host", p.host, b.host_bytes);
  row("nvme", p.nvme, b.nvme_bytes);
  if (p.placement.states == Tier::kNvme) {
    const std::vector<int64_t>& chunks = p.setup.model->chunk_elems();
    size_t pieces = 0;
    for (int64_t n : chunks) pieces += state_piece_sizes(n, p.setup.state_piece_elems).size();
    std::snprintf(line, sizeof(line),
                  "  optimizer states on NVMe: %zu pieces of at most %lld parameters (sub_group_size %lld), "
                  "%d staged at a time\n",
                  pieces, static_cast<long long>(max_state_piece(chunks, p.setup.state_piece_elems)),
                  static_cast<long long>(p.setup.state_piece_elems), kStateStagingBuffers);
    out += line;
  }
  std::snprintf(line, sizeof(line), "  %-14s %14s %10s\n", "link", "per step", "seconds");
  out += line;
  for (const LinkTime& l : p.links) {
    char flops[32];
    std::snprintf(flops, sizeof(flops), "%.3g GFLOP", l.bytes / 1e9);
    std::string amount = l.link == "compute" ? std::string(flops) : format_bytes(static_cast<uint64_t>(l.bytes));
    std::snprintf(line, sizeof(line), "  %-14s %14s %10.4f\n", l.link.c_str(), amount.c_str(), l.seconds);
    out += line;
  }
  if (p.bandwidths.shares_host_cores) {
    std::snprintf(line, sizeof(line),
                  "  predicted step: %.4f s (compute, copies and optimizer in turn on the host's cores, or NVMe if "
                  "slower (reads and writes together): %.4f s, + %.4f s of NVMe writes after the last gradient lands)\n",
                  p.step_seconds, p.overlapped_seconds, p.tail_seconds);
  } else {
    std::snprintf(line, sizeof(line),
                  "  predicted step: %.4f s (the slowest overlapped link, NVMe reads and writes together, %.4f s, + %.4f s "
                  "before the first block can compute, + %.4f s after the last gradient lands)\n",
                  p.step_seconds, p.overlapped_seconds, p.head_seconds, p.tail_seconds);
  }
  out += line;
  out += "  rates: " + p.bandwidths.source + "\n";
  return out;
}

}  // namespace strata::engine
