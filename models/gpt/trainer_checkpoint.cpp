// Trainer's checkpoints: save streams the model's weights (GPT-2 names) and
// every chunk's optimizer state from their tiers into two safetensors files
// and a sealed trainer.json, by the CheckpointDir protocol; load verifies
// the whole checkpoint — the record's seal, each file's size and header,
// each tensor's type, shape, checksum and finiteness — before it replaces
// anything, so a refused checkpoint leaves the trainer as it was.
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "engine/checkpoint_io.h"
#include "engine/checkpoint_parts.h"
#include "models/gpt/trainer.h"

namespace strata::engine {
namespace {

constexpr int kCheckpointFormat = 2;  // 1: no checksums (no "format" key)
const char* const kModelFile = "model.safetensors";
const char* const kOptimizerFile = "optimizer.safetensors";
const char* const kRecordFile = "trainer.json";

// The keys a record had before records were sealed (format 1).
const std::set<std::string>& legacy_record_keys() {
  static const std::set<std::string> keys = {"step",  "updates",   "seed",        "data_position", "grad_accum",
                                             "model", "precision", "adam_states", "loss_scale"};
  return keys;
}

// The parts of a chunk's tensors (`slots`) within elements [offset, offset
// + n) of the chunk: at(k, byte offset in tensor k, byte offset in the
// range, bytes) for each tensor the range overlaps (`es`-byte elements).
Status for_each_tensor_part(const std::vector<gpt::TensorSlot>& slots, int64_t offset, int64_t n, uint64_t es,
                            const std::function<Status(size_t, uint64_t, size_t, size_t)>& at) {
  for (size_t k = 0; k < slots.size(); ++k) {
    const int64_t lo = std::max(offset, slots[k].offset), hi = std::min(offset + n, slots[k].offset + slots[k].numel());
    if (lo >= hi) continue;
    STRATA_RETURN_IF_ERROR(at(k, es * static_cast<uint64_t>(lo - slots[k].offset),
                              es * static_cast<size_t>(lo - offset), es * static_cast<size_t>(hi - lo)));
  }
  return ok_status();
}

nlohmann::json model_json(const gpt::GptConfig& c) {
  return {{"layers", c.layers}, {"hidden", c.hidden}, {"heads", c.heads}, {"vocab", c.vocab}, {"max_seq", c.max_seq}};
}

}  // namespace

Status Trainer::save(const std::string& root) {
  CheckpointDir dir(root);
  return save(dir);
}

Status Trainer::save(CheckpointDir& dir) {
  Status saved = write_checkpoint(dir);
  if (!saved.ok()) dir.abandon();  // the caller's dir lives on: nothing half-written stays
  return saved;
}

Status Trainer::write_checkpoint(CheckpointDir& dir) {
  if (unset_) {
    return failed_precondition(
        "trainer: created without initial weights and states (TrainerOptions::initial_state false); nothing "
        "consistent to save");
  }
  // A delayed update in flight lands, what a failed step left updated goes back.
  STRATA_RETURN_IF_ERROR(session_->prepare_save().with_context("trainer"));
  STRATA_ASSIGN_OR_RETURN(std::string tmp, dir.begin(steps_done()));
  // Model weights, bf16, GPT-2 names.
  std::vector<TensorInfo> tensors;
  for (const auto& chunk : layout()) {
    for (const auto& t : chunk.tensors) tensors.push_back({t.name, tensor_type(options_.precision), t.shape});
  }
  STRATA_ASSIGN_OR_RETURN(SafetensorsWriter model,
                          SafetensorsWriter::create(tmp + "/" + kModelFile, tensors, {{"format", "pt"}}));
  size_t first = 0;  // chunk c's first tensor
  const uint64_t es = dtype_bytes(options_.precision);  // bytes of one working weight
  for (size_t c = 0; c < layout().size(); ++c) {
    const std::vector<gpt::TensorSlot>& slots = layout()[c].tensors;
    // From RAM, or streamed straight from their NVMe blobs a piece at a
    // time: each tensor's part of the piece into its place.
    auto place = [&](int64_t offset, std::span<std::byte> bytes) {
      return for_each_tensor_part(slots, offset, static_cast<int64_t>(bytes.size() / es), es,
                                  [&](size_t k, uint64_t in_tensor, size_t in_piece, size_t len) {
                                    return model.write_at(first + k, in_tensor, bytes.subspan(in_piece, len));
                                  });
    };
    STRATA_RETURN_IF_ERROR(session_->visit_weights(c, place));
    first += slots.size();
    report("saving", static_cast<int64_t>(c + 1), 2 * static_cast<int64_t>(layout().size()));
  }
  STRATA_RETURN_IF_ERROR(model.finish());
  // Optimizer state, streamed piece by piece from its tier into place (no
  // chunk-sized buffer): the master weights, m and v in their stored type
  // (8-bit states: the codes and their per-block scales).
  std::vector<TensorInfo> states;
  std::vector<size_t> first_tensor;
  for (size_t c = 0; c < layout().size(); ++c) {
    first_tensor.push_back(states.size());
    for (TensorInfo& t : state_tensors(chunk_prefix(c), layout()[c].numel, options_.adam_states))
      states.push_back(std::move(t));
  }
  STRATA_ASSIGN_OR_RETURN(SafetensorsWriter opt, SafetensorsWriter::create(tmp + "/" + kOptimizerFile, states));
  for (size_t c = 0; c < layout().size(); ++c) {
    STRATA_RETURN_IF_ERROR(session_->visit_state(c, [&](int part, uint64_t offset, std::span<std::byte> bytes) {
      return opt.write_at(first_tensor[c] + static_cast<size_t>(part), offset, bytes);
    }));
    report("saving", static_cast<int64_t>(layout().size() + c + 1), 2 * static_cast<int64_t>(layout().size()));
  }
  STRATA_RETURN_IF_ERROR(opt.finish());
  STRATA_RETURN_IF_ERROR(write_record(tmp, model, opt));
  return dir.commit(steps_done());
}

// The record binds the data files: their sizes and header digests (the
// headers hold every tensor's checksum), sealed by its own checksum.
Status Trainer::write_record(const std::string& tmp, const SafetensorsWriter& model,
                             const SafetensorsWriter& opt) const {
  nlohmann::json meta = {{"format", kCheckpointFormat},
                         {"files", {{kModelFile, record_file_entry(model)}, {kOptimizerFile, record_file_entry(opt)}}},
                         {"step", steps_done()},
                         {"updates", updates_done()},
                         {"seed", options_.seed},
                         {"data_position", steps_done() * options_.grad_accum},
                         {"grad_accum", options_.grad_accum},
                         {"model", model_json(options_.model)},
                         {"precision", dtype_name(options_.precision)},
                         {"adam_states", cpu_optim::state_type_name(options_.adam_states)}};
  if (options_.precision == DType::kF16) {
    const LossScaler::State ls = session_->loss_scaler().state();
    meta["loss_scale"] = {{"scale", ls.scale}, {"good_steps", ls.good_steps}, {"hysteresis_left", ls.hysteresis_left}};
  }
  {
    std::ofstream out(tmp + "/" + kRecordFile);
    out << seal_record(meta);
    if (!out) return resource_exhausted("checkpoint: writing " + tmp + "/" + kRecordFile + " failed");
  }
  return ok_status();
}

Result<Trainer::CheckpointMeta> Trainer::checkpoint_meta(const std::string& path, bool* legacy) const {
  STRATA_ASSIGN_OR_RETURN(const nlohmann::json meta, open_record(path + "/" + kRecordFile, legacy_record_keys(), legacy));
  // A value of the wrong type (a hand-edited legacy file) throws in
  // nlohmann's accessors: an error, not an exception out of the trainer.
  try {
    return checked_meta(path, meta);
  } catch (const nlohmann::json::exception& e) {
    return data_loss(path + "/" + kRecordFile + ": " + e.what());
  }
}

Result<Trainer::CheckpointMeta> Trainer::checked_meta(const std::string& path, const nlohmann::json& meta) const {
  CheckpointMeta m;
  const nlohmann::json model = meta.contains("model") ? meta.at("model") : nlohmann::json();
  if (model != model_json(options_.model)) {
    return failed_precondition("checkpoint " + path + " is for model " + model.dump() + ", not " +
                               model_json(options_.model).dump());
  }
  const int64_t accum = meta.value("grad_accum", int64_t{1});
  if (accum != options_.grad_accum) {
    return failed_precondition("checkpoint " + path + " was written with grad_accum " + std::to_string(accum) +
                               ", this run uses " + std::to_string(options_.grad_accum) +
                               " (the data position counts micro-batches of that size)");
  }
  const std::string precision = meta.value("precision", std::string("bf16"));
  if (precision != dtype_name(options_.precision)) {
    return failed_precondition("checkpoint " + path + " holds " + precision + " weights, this run uses " +
                               std::string(dtype_name(options_.precision)));
  }
  const std::string adam_states = meta.value("adam_states", std::string("fp32"));
  if (adam_states != cpu_optim::state_type_name(options_.adam_states)) {
    return failed_precondition("checkpoint " + path + " holds " + adam_states + " Adam states, this run keeps " +
                               std::string(cpu_optim::state_type_name(options_.adam_states)));
  }
  if (options_.precision == DType::kF16) {
    if (!meta.contains("loss_scale")) return data_loss(path + "/trainer.json: an fp16 checkpoint without loss_scale");
    m.loss_scale.scale = meta["loss_scale"].value("scale", 0.0);
    m.loss_scale.good_steps = meta["loss_scale"].value("good_steps", int64_t{-1});
    m.loss_scale.hysteresis_left = meta["loss_scale"].value("hysteresis_left", 0);
    LossScaler probe = session_->loss_scaler();
    STRATA_RETURN_IF_ERROR(probe.restore(m.loss_scale).with_context("checkpoint " + path));
  }
  if (!meta.contains("step") || !meta["step"].is_number_integer() || meta["step"].get<int64_t>() < 0) {
    return data_loss(path + "/trainer.json: no step count");
  }
  m.step = meta["step"].get<int64_t>();
  if (meta.contains("files")) {
    for (const auto& [name, f] : meta.at("files").items()) {
      m.files[name] = {f.at("bytes").get<uint64_t>(), f.at("header_xxh3").get<std::string>()};
    }
  }
  // Written before skipped steps were counted apart: every step an update.
  m.updates = meta.value("updates", m.step);
  if (m.updates < 0 || m.updates > m.step) {
    return data_loss(path + "/trainer.json: updates " + std::to_string(m.updates) + " outside 0.." +
                     std::to_string(m.step));
  }
  return m;
}

Status Trainer::load(const std::string& root) {
  CheckpointDir dir(root);
  STRATA_ASSIGN_OR_RETURN(CheckpointDir::Entry latest, dir.latest());
  const std::string& path = latest.path;
  bool legacy = false;
  STRATA_ASSIGN_OR_RETURN(const CheckpointMeta meta, checkpoint_meta(path, &legacy));
  if (meta.step != latest.step) {
    return data_loss(path + "/" + kRecordFile + " claims step " + std::to_string(meta.step) + ", its directory is step " +
                     std::to_string(latest.step));
  }
  STRATA_ASSIGN_OR_RETURN(SafetensorsReader model, SafetensorsReader::open(path + "/" + kModelFile));
  STRATA_ASSIGN_OR_RETURN(SafetensorsReader opt, SafetensorsReader::open(path + "/" + kOptimizerFile));
  // Everything is checked before anything is loaded: a refused checkpoint
  // leaves the trainer as it was.
  STRATA_RETURN_IF_ERROR(verify_checkpoint(path, meta, legacy, model, opt));
  // From here a failure (an I/O error) leaves the weights and states
  // part-loaded: steps and saves are refused until a load succeeds. An
  // unstarted session (initial_state false) is placed now, without initial
  // values; a started one's delayed update in flight lands first.
  STRATA_RETURN_IF_ERROR(session_->begin_load("loading checkpoint " + path + " failed part way"));
  unset_ = false;
  const uint64_t es = dtype_bytes(options_.precision);  // bytes of one working weight
  for (size_t c = 0; c < layout().size(); ++c) {
    const std::vector<gpt::TensorSlot>& slots = layout()[c].tensors;
    // Into RAM (pinned) or into their NVMe blobs, a piece at a time.
    auto fill = [&](int64_t offset, std::span<std::byte> bytes) {
      return for_each_tensor_part(slots, offset, static_cast<int64_t>(bytes.size() / es), es,
                                  [&](size_t k, uint64_t in_tensor, size_t in_piece, size_t len) {
                                    return model.read(slots[k].name, bytes.subspan(in_piece, len), in_tensor);
                                  });
    };
    STRATA_RETURN_IF_ERROR(session_->replace_weights(c, fill));
    report("loading", static_cast<int64_t>(c + 1), 2 * static_cast<int64_t>(layout().size()));
  }
  for (size_t c = 0; c < layout().size(); ++c) {
    const std::vector<TensorInfo> parts = state_tensors(chunk_prefix(c), layout()[c].numel, options_.adam_states);
    STRATA_RETURN_IF_ERROR(session_->replace_state(c, [&](int part, uint64_t offset, std::span<std::byte> bytes) {
      return opt.read(parts[static_cast<size_t>(part)].name, bytes, offset);
    }));
    report("loading", static_cast<int64_t>(layout().size() + c + 1), 2 * static_cast<int64_t>(layout().size()));
  }
  Session::Counts counts;
  counts.steps = meta.step;
  counts.updates = meta.updates;
  if (options_.precision == DType::kF16) counts.loss_scale = meta.loss_scale;
  return session_->end_load(counts);
}

Status Trainer::verify_checkpoint(const std::string& path, const CheckpointMeta& meta, bool legacy,
                                  const SafetensorsReader& model, const SafetensorsReader& opt) const {
  // Each file is the one the record names, by size and header digest.
  for (const SafetensorsReader* r : {&model, &opt}) {
    if (legacy) break;  // an unsealed record names no files
    const std::string name = r == &model ? kModelFile : kOptimizerFile;
    const auto it = meta.files.find(name);
    const nlohmann::json entry = it == meta.files.end() ? nlohmann::json()
                                                        : nlohmann::json{{"bytes", it->second.first},
                                                                         {"header_xxh3", it->second.second}};
    STRATA_RETURN_IF_ERROR(check_record_file(path, kRecordFile, name, it == meta.files.end() ? nullptr : &entry, *r));
  }
  if (legacy) {
    log_warning("checkpoint " + path + " was written by a strata without checksums: its contents cannot be "
                "verified (only their types, shapes and finiteness are checked); save it again to seal it");
  }
  // Every tensor this trainer reads is there in its type and shape.
  for (const gpt::ChunkLayout& chunk : layout()) {
    for (const gpt::TensorSlot& t : chunk.tensors) {
      STRATA_RETURN_IF_ERROR(check_tensor(path, kModelFile, model, {t.name, tensor_type(options_.precision), t.shape}));
    }
  }
  for (size_t c = 0; c < layout().size(); ++c) {
    for (const TensorInfo& t : state_tensors(chunk_prefix(c), layout()[c].numel, options_.adam_states)) {
      STRATA_RETURN_IF_ERROR(check_tensor(path, kOptimizerFile, opt, t));
    }
  }
  // Then every byte against its checksum, and every weight and state
  // finite, streamed once before the load reads them again.
  int64_t done = 0;
  const auto total = static_cast<int64_t>(model.tensors().size() + opt.tensors().size());
  for (const SafetensorsReader* r : {&model, &opt}) {
    const std::string file = path + "/" + (r == &model ? kModelFile : kOptimizerFile);
    STRATA_RETURN_IF_ERROR(verify_tensors(file, *r, [&] { report("verifying", ++done, total); }));
  }
  return ok_status();
}

}  // namespace strata::engine
