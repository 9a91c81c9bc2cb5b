// strata.safetensors' native half: a strata checkpoint's weights as one
// safetensors file under GPT-2 / Hugging Face names, and any safetensors
// file read back (verified against strata's checksums when it has them).
#include "bindings/python/safetensors.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "engine/checkpoint_io.h"
#include "engine/checkpoint_parts.h"
#include "models/gpt/gpt_config.h"

namespace py = pybind11;

namespace strata::python {
namespace {

[[noreturn]] void raise(const Status& s, const std::string& path) {
  const std::string m = std::string(status_code_name(s.code())) + ": " + std::string(s.message());
  switch (s.code()) {
    case StatusCode::kNotFound:
      PyErr_SetObject(PyExc_FileNotFoundError, py::make_tuple(ENOENT, m, path).ptr());
      throw py::error_already_set();
    case StatusCode::kInvalidArgument:
      throw py::value_error(m);
    default:
      PyErr_SetObject(PyExc_OSError, py::make_tuple(EIO, m, path).ptr());
      throw py::error_already_set();
  }
}

template <typename T>
T value_or_raise(Result<T> r, const std::string& path) {
  if (!r) raise(r.error(), path);
  return std::move(*r);
}

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The checkpoint directory `src` names: itself when it holds trainer.json,
// else the latest checkpoint under it.
std::string step_dir(const std::string& src) {
  if (std::ifstream(src + "/trainer.json").good()) return src;
  if (!is_dir(src)) raise(not_found("checkpoint " + src + " does not exist"), src);
  engine::CheckpointDir dir(src);
  return value_or_raise(dir.latest(), src).path;
}

// The checks a resume makes of the optimizer file before anything is
// written: it is the file the sealed record names (size, header digest),
// and every byte matches its checksum and every value is finite. A
// checkpoint from before checksums can only be checked for finiteness.
void verify_states(const std::string& path, const nlohmann::json& record, bool legacy,
                   const engine::SafetensorsReader& states) {
  const std::string name = "optimizer.safetensors";
  if (!legacy) {
    const nlohmann::json* entry = nullptr;
    if (record.contains("files") && record.at("files").contains(name)) entry = &record.at("files").at(name);
    Status same = engine::check_record_file(path, "trainer.json", name, entry, states);
    if (!same.ok()) raise(same, path);
  }
  if (!states.has_checksums()) return;
  Status ok;
  {
    py::gil_scoped_release unlocked;
    ok = engine::verify_tensors(path + "/" + name, states, {});
  }
  if (!ok.ok()) raise(ok, path);
}

// Writes the checkpoint's fp32 master weights (dtype "fp32") or their
// bf16 rounding ("bf16") to `out` as one safetensors file: GPT-2 names,
// each with `prefix` ("transformer." for Hugging Face's GPT2LMHeadModel).
// Returns the model's config (the record's "model").
py::dict export_checkpoint(const std::string& src, const std::string& out, const std::string& dtype,
                           const std::string& prefix) {
  if (dtype != "fp32" && dtype != "bf16") throw py::value_error("dtype: expected \"fp32\" or \"bf16\", got " + dtype);
  const std::string path = step_dir(src);
  bool legacy = false;
  nlohmann::json record = value_or_raise(engine::open_record(path + "/trainer.json", {}, &legacy), path);
  if (!record.contains("model")) {
    raise(invalid_argument(path + " is not a checkpoint of the built-in GPT (its record names no model)"), path);
  }
  const nlohmann::json& mj = record.at("model");
  gpt::GptConfig config;
  try {
    config.layers = mj.at("layers").get<int64_t>();
    config.hidden = mj.at("hidden").get<int64_t>();
    config.heads = mj.at("heads").get<int64_t>();
    config.vocab = mj.at("vocab").get<int64_t>();
    config.max_seq = mj.at("max_seq").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    raise(data_loss(path + "/trainer.json: model: " + e.what()), path);
  }
  const std::vector<gpt::ChunkLayout> layout = gpt::model_layout(config);
  engine::SafetensorsReader states =
      value_or_raise(engine::SafetensorsReader::open(path + "/optimizer.safetensors"), path);
  verify_states(path, record, legacy, states);
  const engine::TensorType type = dtype == "fp32" ? engine::TensorType::kF32 : engine::TensorType::kBF16;
  std::vector<engine::TensorInfo> tensors;
  for (const auto& chunk : layout) {
    for (const auto& t : chunk.tensors) tensors.push_back({prefix + t.name, type, t.shape});
  }
  engine::SafetensorsWriter writer =
      value_or_raise(engine::SafetensorsWriter::create(out, tensors, {{"format", "pt"}}), out);
  std::vector<float> master;
  std::vector<uint16_t> half;
  {
    py::gil_scoped_release unlocked;
    for (size_t c = 0; c < layout.size(); ++c) {
      const std::string name = "chunk-" + std::to_string(c) + ".master";
      const engine::TensorInfo* info = states.find(name);
      if (!info || info->dtype != engine::TensorType::kF32 ||
          info->bytes() != static_cast<uint64_t>(layout[c].numel) * 4) {
        py::gil_scoped_acquire locked;
        raise(data_loss(path + "/optimizer.safetensors: " + name + " is missing or not the model's chunk " +
                        std::to_string(c)),
              path);
      }
      master.resize(static_cast<size_t>(layout[c].numel));
      Status read = states.read(name, std::as_writable_bytes(std::span(master)));
      for (const auto& t : layout[c].tensors) {
        if (!read.ok()) break;
        std::span<const float> values(master.data() + t.offset, static_cast<size_t>(t.numel()));
        if (type == engine::TensorType::kF32) {
          read = writer.append(std::as_bytes(values));
        } else {
          half.resize(values.size());
          for (size_t i = 0; i < values.size(); ++i) half[i] = f32_to_bf16(values[i]);
          read = writer.append(std::as_bytes(std::span(half)));
        }
      }
      if (!read.ok()) {
        py::gil_scoped_acquire locked;
        raise(read, out);
      }
    }
    Status done = writer.finish();
    if (!done.ok()) {
      py::gil_scoped_acquire locked;
      raise(done, out);
    }
  }
  py::dict d;
  d["layers"] = config.layers;
  d["hidden"] = config.hidden;
  d["heads"] = config.heads;
  d["vocab"] = config.vocab;
  d["max_seq"] = config.max_seq;
  d["step"] = record.value("step", int64_t{0});
  d["source"] = path;
  return d;
}

// Every tensor of a safetensors file: [(name, dtype, shape, bytes as a
// uint8 array)], verified against its checksums when strata wrote it.
py::list read_file(const std::string& path) {
  engine::SafetensorsReader r = value_or_raise(engine::SafetensorsReader::open(path), path);
  if (r.has_checksums()) {
    Status ok = r.verify([](const engine::TensorInfo&, uint64_t, std::span<const std::byte>) { return ok_status(); });
    if (!ok.ok()) raise(ok, path);
  }
  py::list out;
  for (const engine::TensorInfo& t : r.tensors()) {
    py::array_t<uint8_t> bytes(static_cast<py::ssize_t>(t.bytes()));
    Status s = r.read(t.name, std::span(reinterpret_cast<std::byte*>(bytes.mutable_data()), t.bytes()));
    if (!s.ok()) raise(s, path);
    const char* names[] = {"F32", "F16", "BF16", "U8"};
    out.append(py::make_tuple(t.name, names[static_cast<int>(t.dtype)], t.shape, bytes));
  }
  return out;
}

}  // namespace

void add_safetensors(py::module_& m) {
  m.def("export_checkpoint", &export_checkpoint, py::arg("src"), py::arg("out"), py::arg("dtype"),
        py::arg("prefix"));
  m.def("read_safetensors", &read_file, py::arg("path"));
}

}  // namespace strata::python
