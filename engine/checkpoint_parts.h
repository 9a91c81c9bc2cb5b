// What the trainer's and the session's checkpoints share: the names and
// types of a chunk's optimizer-state tensors, a data file's entry in a
// sealed record, and the checks a load makes before it replaces anything
// (each file is the one the record names; each tensor is there in its type
// and shape; every byte matches its checksum and every weight is finite).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cpu_optim/optimizer.h"
#include "engine/checkpoint_io.h"

namespace strata::engine {

// The tensors of a chunk's optimizer state, in the order of
// OptimizerStage::StateSlice's parts, as stored: <prefix>master, m, v, and
// the 8-bit states' m_scale and v_scale.
std::vector<TensorInfo> state_tensors(const std::string& prefix, int64_t elems, cpu_optim::StateType states);
// The trainer's prefix for chunk c's state tensors.
inline std::string chunk_prefix(size_t chunk) { return "chunk-" + std::to_string(chunk) + "."; }

// A finished file's entry in a record: its size and header digest.
nlohmann::json record_file_entry(const SafetensorsWriter& file);
// DataLoss unless `file` (called `name` in checkpoint `path`) is the one
// `entry` (record_file_entry's, from the record; null: none) describes and
// carries its checksums.
Status check_record_file(const std::string& path, const std::string& record_name, const std::string& name,
                         const nlohmann::json* entry, const SafetensorsReader& file);
// DataLoss unless `file` holds `want` in its type and shape.
Status check_tensor(const std::string& path, const std::string& name, const SafetensorsReader& file,
                    const TensorInfo& want);
// Streams every tensor of `file` (at `file_path`) against its checksum and
// its values' finiteness; `done` (may be empty) after each tensor.
Status verify_tensors(const std::string& file_path, const SafetensorsReader& file, const std::function<void()>& done);

}  // namespace strata::engine
