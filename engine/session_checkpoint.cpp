// Session's checkpoints (session.h, save / load): each chunk's working
// weights and optimizer state streamed from its tier into two safetensors
// files — the weights under the model's tensor names (TensorView) or the
// chunk's own, the states under the chunk's — and a sealed session.json binding them,
// by the CheckpointDir protocol; a load verifies everything before it
// replaces anything (checkpoint_parts.h), so a refused checkpoint leaves
// the session as it was.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "engine/checkpoint_parts.h"
#include "engine/session.h"

namespace strata::engine {
namespace {

constexpr int kSessionFormat = 1;
const char* const kModelFile = "model.safetensors";
const char* const kOptimizerFile = "optimizer.safetensors";
const char* const kRecordFile = "session.json";

}  // namespace

Status Session::prepare_save() {
  STRATA_RETURN_IF_ERROR(usable("save"));
  if (!started()) return failed_precondition("session: save before start: nothing is placed yet");
  if (in_step_) return failed_precondition("session: save during a step (end_step or cancel_step first)");
  STRATA_RETURN_IF_ERROR(close_eval("save"));
  if (!broken_.empty()) return failed_precondition("session: " + broken_ + "; nothing consistent to save");
  STRATA_RETURN_IF_ERROR(drain_update().with_context("session: save"));  // a delayed update in flight lands first
  return restore_stale();                                         // what a failed step left updated goes back first
}

Status Session::check_access(const char* call, size_t chunk) const {
  STRATA_RETURN_IF_ERROR(usable(call));
  if (!started()) return failed_precondition(std::string("session: ") + call + " before start");
  if (in_step_) return failed_precondition(std::string("session: ") + call + " during a step");
  if (chunk >= specs_.size()) {
    return invalid_argument(std::string("session: ") + call + ": no chunk " + std::to_string(chunk));
  }
  return ok_status();
}

Status Session::visit_weights(size_t chunk, const OptimizerStage::WeightsSlice& fn) {
  STRATA_RETURN_IF_ERROR(check_access("visit_weights", chunk));
  if (weights_.empty()) return stage_->visit_weights(chunk, fn);
  return fn(0, std::span(weights_[chunk].data(), weights_[chunk].size()));
}

Status Session::visit_state(size_t chunk, const OptimizerStage::StateSlice& fn) {
  STRATA_RETURN_IF_ERROR(check_access("visit_state", chunk));
  return stage_->visit_state(chunk, fn);
}

Status Session::begin_load(const std::string& what) {
  STRATA_RETURN_IF_ERROR(usable("load"));
  if (in_step_) return failed_precondition("session: load during a step (end_step or cancel_step first)");
  STRATA_RETURN_IF_ERROR(close_eval("load"));
  if (!started()) {
    // Placed without initial values: the load writes every byte once.
    STRATA_RETURN_IF_ERROR(start(/*initial=*/false));
  } else {
    update_failed_.store(false);  // what the load replaces
    STRATA_RETURN_IF_ERROR(drain_update().with_context("session: load"));
  }
  broken_ = what;
  return ok_status();
}

Status Session::replace_weights(size_t chunk, const OptimizerStage::WeightsSlice& fn) {
  STRATA_RETURN_IF_ERROR(check_access("replace_weights", chunk));
  if (weights_.empty()) return stage_->replace_weights(chunk, fn);
  // In place: the buffer is pinned. A failed read leaves it part-loaded.
  return fn(0, std::span(weights_[chunk].data(), weights_[chunk].size()));
}

Status Session::replace_state(size_t chunk, const OptimizerStage::StateSlice& fn) {
  STRATA_RETURN_IF_ERROR(check_access("replace_state", chunk));
  return stage_->replace_state(chunk, fn);
}

Status Session::end_load(const Counts& counts) {
  STRATA_RETURN_IF_ERROR(usable("load"));
  if (!started()) return failed_precondition("session: end_load without begin_load");
  if (counts.steps < 0 || counts.updates < 0 || counts.updates > counts.steps) {
    return invalid_argument("session: end_load: updates must be 0..steps");
  }
  if (options_.precision == DType::kF16) {
    if (!counts.loss_scale) return invalid_argument("session: end_load: an fp16 session needs its loss scale");
    STRATA_RETURN_IF_ERROR(scaler_.restore(*counts.loss_scale));
  }
  steps_ = counts.steps;
  updates_ = counts.updates;
  stale_.assign(specs_.size(), false);
  broken_.clear();  // every chunk's weights and state came from the checkpoint
  return ok_status();
}

Status Session::save(const std::string& root) {
  STRATA_RETURN_IF_ERROR(prepare_save());
  CheckpointDir dir(root);
  STRATA_RETURN_IF_ERROR(dir.lock());
  STRATA_ASSIGN_OR_RETURN(std::string tmp, dir.begin(steps_));
  Status written = write_checkpoint(tmp);
  if (!written.ok()) {
    dir.abandon();  // nothing half-written stays
    return written;
  }
  return dir.commit(steps_);
}

// The model file's tensors in order: each chunk's views (by offset), or
// the chunk whole under its name.
std::vector<Session::SavedTensor> Session::saved_tensors(std::vector<TensorInfo>* infos) const {
  std::vector<SavedTensor> saved;
  for (size_t c = 0; c < specs_.size(); ++c) {
    const Spec& s = specs_[c];
    const TensorType type = tensor_type(s.dtype);
    if (s.tensors.empty()) {
      saved.push_back({c, 0, s.elems});
      infos->push_back({s.name, type, {s.elems}});
    }
    for (const TensorView& t : s.tensors) {
      saved.push_back({c, t.offset, t.elems()});
      infos->push_back({t.name, type, t.shape});
    }
  }
  return saved;
}

// The chunks as session.json records them (and a load must find them).
nlohmann::json Session::chunks_record() const {
  nlohmann::json chunks = nlohmann::json::array();
  for (const Spec& s : specs_) {
    nlohmann::json c = {{"name", s.name}, {"elems", s.elems}};
    // Only where it is not the precision: a record of one type stays as it was.
    if (s.dtype != options_.precision) c["dtype"] = dtype_name(s.dtype);
    for (const TensorView& t : s.tensors)
      c["tensors"].push_back({{"name", t.name}, {"offset", t.offset}, {"shape", t.shape}});
    chunks.push_back(std::move(c));
  }
  return chunks;
}

// Each saved tensor's working weights, from RAM or, a piece at a time, from
// their NVMe blobs (a piece may span several tensors and padding).
Status Session::write_weights(SafetensorsWriter& model, const std::vector<SavedTensor>& saved) {
  for (size_t c = 0; c < specs_.size(); ++c) {
    const uint64_t es = dtype_bytes(specs_[c].dtype);
    auto piece = [&](int64_t offset, std::span<std::byte> bytes) -> Status {
      const int64_t end = offset + static_cast<int64_t>(bytes.size() / es);
      for (size_t i = 0; i < saved.size(); ++i) {
        const SavedTensor& t = saved[i];
        const int64_t lo = std::max(offset, t.offset), hi = std::min(end, t.offset + t.elems);
        if (t.chunk != c || lo >= hi) continue;
        STRATA_RETURN_IF_ERROR(
            model.write_at(i, static_cast<uint64_t>(lo - t.offset) * es,
                           bytes.subspan(static_cast<size_t>(lo - offset) * es, static_cast<size_t>(hi - lo) * es)));
      }
      return ok_status();
    };
    STRATA_RETURN_IF_ERROR(visit_weights(c, piece));
    report("saving", static_cast<int64_t>(c + 1), 2 * static_cast<int64_t>(specs_.size()));
  }
  return ok_status();
}

Status Session::write_checkpoint(const std::string& tmp) {
  std::vector<TensorInfo> weights, states;
  const std::vector<SavedTensor> saved = saved_tensors(&weights);
  std::vector<size_t> first_state;
  for (const Spec& s : specs_) {
    first_state.push_back(states.size());
    for (TensorInfo& t : state_tensors(s.name + ".", s.elems, options_.adam_states)) states.push_back(std::move(t));
  }
  STRATA_ASSIGN_OR_RETURN(SafetensorsWriter model,
                          SafetensorsWriter::create(tmp + "/" + kModelFile, weights, {{"format", "pt"}}));
  STRATA_RETURN_IF_ERROR(write_weights(model, saved));
  STRATA_RETURN_IF_ERROR(model.finish());
  STRATA_ASSIGN_OR_RETURN(SafetensorsWriter opt, SafetensorsWriter::create(tmp + "/" + kOptimizerFile, states));
  for (size_t c = 0; c < specs_.size(); ++c) {
    STRATA_RETURN_IF_ERROR(stage_->visit_state(c, [&](int part, uint64_t offset, std::span<std::byte> bytes) {
      return opt.write_at(first_state[c] + static_cast<size_t>(part), offset, bytes);
    }));
    report("saving", static_cast<int64_t>(specs_.size() + c + 1), 2 * static_cast<int64_t>(specs_.size()));
  }
  STRATA_RETURN_IF_ERROR(opt.finish());
  nlohmann::json record = {
      {"format", kSessionFormat},
      {"files", {{kModelFile, record_file_entry(model)}, {kOptimizerFile, record_file_entry(opt)}}},
      {"step", steps_},
      {"updates", updates_},
      {"lr", lr_},
      {"last_clipped", last_clipped_},
      {"last_skipped", last_skipped_},
      {"landing_order", landing_order_},
      {"chunks", chunks_record()},
      {"precision", dtype_name(options_.precision)},
      {"adam_states", cpu_optim::state_type_name(options_.adam_states)}};
  if (options_.precision == DType::kF16) {
    const LossScaler::State ls = scaler_.state();
    record["loss_scale"] = {{"scale", ls.scale}, {"good_steps", ls.good_steps}, {"hysteresis_left", ls.hysteresis_left}};
  }
  std::ofstream out(tmp + "/" + kRecordFile);
  out << seal_record(record);
  out.close();
  if (!out) return resource_exhausted("session: writing " + tmp + "/" + kRecordFile + " failed");
  return ok_status();
}

// The record of checkpoint `path`, checked against this session: the same
// chunks, precision and state type, and counts that make sense.
Result<nlohmann::json> Session::checked_record(const std::string& path) const {
  bool legacy = false;
  STRATA_ASSIGN_OR_RETURN(nlohmann::json r, open_record(path + "/" + kRecordFile, {}, &legacy));
  const std::string where = "checkpoint " + path;
  const nlohmann::json chunks = chunks_record();
  if (r.value("chunks", nlohmann::json()) != chunks) {
    return failed_precondition(where + " holds the chunks " + r.value("chunks", nlohmann::json()).dump() +
                               ", this session registered " + chunks.dump());
  }
  if (r.value("precision", std::string()) != dtype_name(options_.precision)) {
    return failed_precondition(where + " holds " + r.value("precision", std::string("?")) + " weights, this session " +
                               std::string(dtype_name(options_.precision)));
  }
  if (r.value("adam_states", std::string()) != cpu_optim::state_type_name(options_.adam_states)) {
    return failed_precondition(where + " holds " + r.value("adam_states", std::string("?")) +
                               " Adam states, this session keeps " +
                               std::string(cpu_optim::state_type_name(options_.adam_states)));
  }
  const int64_t step = r.value("step", int64_t{-1}), updates = r.value("updates", int64_t{-1});
  const nlohmann::json order = r.value("landing_order", nlohmann::json());
  if (step < 0 || updates < 0 || updates > step || !order.is_array() || order.size() != specs_.size()) {
    return data_loss(path + "/" + kRecordFile + ": step, updates or landing order out of range");
  }
  for (const nlohmann::json& c : order) {
    if (!c.is_number_unsigned() || c.get<uint64_t>() >= specs_.size()) {
      return data_loss(path + "/" + kRecordFile + ": a landing order entry outside the chunks");
    }
  }
  if (options_.precision == DType::kF16) {
    LossScaler probe = scaler_;
    const nlohmann::json ls = r.value("loss_scale", nlohmann::json::object());
    STRATA_RETURN_IF_ERROR(probe.restore({ls.value("scale", 0.0), ls.value("good_steps", int64_t{-1}),
                                          ls.value("hysteresis_left", 0)})
                               .with_context(where));
  }
  return r;
}

Status Session::load(const std::string& root) {
  STRATA_RETURN_IF_ERROR(usable("load"));
  if (in_step_) return failed_precondition("session: load during a step (end_step or cancel_step first)");
  STRATA_RETURN_IF_ERROR(close_eval("load"));
  if (specs_.empty()) return failed_precondition("session: load with no chunk registered (add_chunk first)");
  CheckpointDir dir(root);
  STRATA_ASSIGN_OR_RETURN(CheckpointDir::Entry latest, dir.latest());
  const std::string& path = latest.path;
  nlohmann::json record;
  try {  // a value of the wrong type throws in nlohmann's accessors: an error, not an exception
    STRATA_ASSIGN_OR_RETURN(record, checked_record(path));
  } catch (const nlohmann::json::exception& e) {
    return data_loss(path + "/" + kRecordFile + ": " + e.what());
  }
  if (record["step"].get<int64_t>() != latest.step) {
    return data_loss(path + "/" + kRecordFile + " claims step " + record["step"].dump() + ", its directory is step " +
                     std::to_string(latest.step));
  }
  STRATA_ASSIGN_OR_RETURN(SafetensorsReader model, SafetensorsReader::open(path + "/" + kModelFile));
  STRATA_ASSIGN_OR_RETURN(SafetensorsReader opt, SafetensorsReader::open(path + "/" + kOptimizerFile));
  const nlohmann::json files = record.value("files", nlohmann::json::object());
  for (const auto& [name, r] : {std::pair<std::string, const SafetensorsReader*>{kModelFile, &model},
                                {kOptimizerFile, &opt}}) {
    const nlohmann::json* entry = files.contains(name) ? &files.at(name) : nullptr;
    STRATA_RETURN_IF_ERROR(check_record_file(path, kRecordFile, name, entry, *r));
  }
  std::vector<TensorInfo> weights;
  saved_tensors(&weights);
  for (const TensorInfo& t : weights) STRATA_RETURN_IF_ERROR(check_tensor(path, kModelFile, model, t));
  for (const Spec& s : specs_) {
    for (const TensorInfo& t : state_tensors(s.name + ".", s.elems, options_.adam_states)) {
      STRATA_RETURN_IF_ERROR(check_tensor(path, kOptimizerFile, opt, t));
    }
  }
  int64_t verified = 0;
  const auto tensors = static_cast<int64_t>(model.tensors().size() + opt.tensors().size());
  for (const SafetensorsReader* r : {&model, &opt}) {
    const std::string file = path + "/" + (r == &model ? kModelFile : kOptimizerFile);
    STRATA_RETURN_IF_ERROR(verify_tensors(file, *r, [&] { report("verifying", ++verified, tensors); }));
  }
  // Verified whole. A session not started yet is placed now without its
  // initial values (no init called, nothing initial written: a 10B model's
  // states are not written twice); a started one's delayed update in
  // flight lands first. From here only an I/O error can stop it, leaving
  // the weights and states part-loaded.
  STRATA_RETURN_IF_ERROR(begin_load("loading checkpoint " + path + " failed part way"));
  STRATA_RETURN_IF_ERROR(read_checkpoint(path, model, opt));
  Counts counts;
  counts.steps = record["step"].get<int64_t>();
  counts.updates = record["updates"].get<int64_t>();
  if (options_.precision == DType::kF16) {
    const nlohmann::json& ls = record["loss_scale"];
    counts.loss_scale =
        LossScaler::State{ls.value("scale", 0.0), ls.value("good_steps", int64_t{-1}), ls.value("hysteresis_left", 0)};
  }
  STRATA_RETURN_IF_ERROR(end_load(counts));
  lr_ = record.value("lr", lr_);
  last_clipped_ = record.value("last_clipped", false);
  last_skipped_ = record.value("last_skipped", false);
  landing_order_ = record["landing_order"].get<std::vector<size_t>>();
  return ok_status();
}

// Each saved tensor's working weights into RAM or, a piece at a time, into
// their NVMe blobs; padding between tensors (never saved) is zeros.
Status Session::read_weights(const SafetensorsReader& model, const std::vector<SavedTensor>& saved,
                             const std::vector<TensorInfo>& infos) {
  for (size_t c = 0; c < specs_.size(); ++c) {
    const uint64_t es = dtype_bytes(specs_[c].dtype);
    auto piece = [&](int64_t offset, std::span<std::byte> bytes) -> Status {
      std::fill(bytes.begin(), bytes.end(), std::byte{0});
      const int64_t end = offset + static_cast<int64_t>(bytes.size() / es);
      for (size_t i = 0; i < saved.size(); ++i) {
        const SavedTensor& t = saved[i];
        const int64_t lo = std::max(offset, t.offset), hi = std::min(end, t.offset + t.elems);
        if (t.chunk != c || lo >= hi) continue;
        STRATA_RETURN_IF_ERROR(model.read(
            infos[i].name, bytes.subspan(static_cast<size_t>(lo - offset) * es, static_cast<size_t>(hi - lo) * es),
            static_cast<uint64_t>(lo - t.offset) * es));
      }
      return ok_status();
    };
    STRATA_RETURN_IF_ERROR(replace_weights(c, piece));
    report("loading", static_cast<int64_t>(c + 1), 2 * static_cast<int64_t>(specs_.size()));
  }
  return ok_status();
}

Status Session::read_checkpoint(const std::string& path, const SafetensorsReader& model, const SafetensorsReader& opt) {
  std::vector<TensorInfo> infos;
  const std::vector<SavedTensor> saved = saved_tensors(&infos);
  STRATA_RETURN_IF_ERROR(read_weights(model, saved, infos).with_context("session: loading " + path));
  for (size_t c = 0; c < specs_.size(); ++c) {
    const std::vector<TensorInfo> parts = state_tensors(specs_[c].name + ".", specs_[c].elems, options_.adam_states);
    STRATA_RETURN_IF_ERROR(replace_state(c, [&](int part, uint64_t offset, std::span<std::byte> bytes) {
                             return opt.read(parts[static_cast<size_t>(part)].name, bytes, offset);
                           }).with_context("session: loading " + path));
    report("loading", static_cast<int64_t>(specs_.size() + c + 1), 2 * static_cast<int64_t>(specs_.size()));
  }
  return ok_status();
}

}  // namespace strata::engine
