#include "engine/checkpoint_parts.h"

#include "engine/optimizer_stage.h"

namespace strata::engine {

std::vector<TensorInfo> state_tensors(const std::string& prefix, int64_t n, cpu_optim::StateType states) {
  const StateLayout l = StateLayout::of(n, states);
  const TensorType mv = states == cpu_optim::StateType::kF32    ? TensorType::kF32
                        : states == cpu_optim::StateType::kBF16 ? TensorType::kBF16
                                                                : TensorType::kU8;
  std::vector<TensorInfo> parts = {
      {prefix + "master", TensorType::kF32, {n}}, {prefix + "m", mv, {n}}, {prefix + "v", mv, {n}}};
  if (l.scales > 0) {
    parts.push_back({prefix + "m_scale", TensorType::kF32, {l.scales}});
    parts.push_back({prefix + "v_scale", TensorType::kF32, {l.scales}});
  }
  return parts;
}

nlohmann::json record_file_entry(const SafetensorsWriter& w) {
  return {{"bytes", w.file_bytes()}, {"header_xxh3", hex64(w.header_digest())}};
}

Status check_record_file(const std::string& path, const std::string& record_name, const std::string& name,
                         const nlohmann::json* entry, const SafetensorsReader& r) {
  if (entry == nullptr) return data_loss(path + "/" + record_name + " names no " + name);
  const bool same = entry->is_object() && entry->value("bytes", uint64_t{0}) == r.file_bytes() &&
                    entry->value("header_xxh3", std::string()) == hex64(r.header_digest());
  if (!same || !r.has_checksums()) {
    return data_loss("checkpoint " + path + ": " + name + " is not the file " + record_name +
                     " describes (its size or header differs): damaged or replaced; nothing was loaded");
  }
  return ok_status();
}

Status check_tensor(const std::string& path, const std::string& name, const SafetensorsReader& r,
                    const TensorInfo& want) {
  const TensorInfo* got = r.find(want.name);
  if (got == nullptr || got->dtype != want.dtype || got->shape != want.shape) {
    return data_loss("checkpoint " + path + ": " + name + " has no tensor " + want.name +
                     " of this run's type and shape; nothing was loaded");
  }
  return ok_status();
}

Status verify_tensors(const std::string& file_path, const SafetensorsReader& r, const std::function<void()>& done) {
  return r.verify([&](const TensorInfo& t, uint64_t offset, std::span<const std::byte> bytes) {
    Status finite = check_finite(file_path, t, offset, bytes);
    if (finite.ok() && offset + bytes.size() == t.bytes() && done) done();
    return finite;
  });
}

}  // namespace strata::engine
