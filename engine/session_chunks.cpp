// Registering a model's chunks and the tensors in them (session.h:
// add_chunk, set_chunk_dtype, add_tensor), all before start().
#include <algorithm>

#include "common/dtype.h"
#include "engine/session.h"

namespace strata::engine {

Result<size_t> Session::add_chunk(std::string name, int64_t elems, ChunkInit init, std::optional<DType> dtype) {
  STRATA_RETURN_IF_ERROR(usable("add_chunk"));
  if (started()) return failed_precondition("session: add_chunk after start: chunk \"" + name + "\" comes too late");
  if (name.empty()) return invalid_argument("session: add_chunk: a chunk needs a name");
  if (elems < 1 || elems > (int64_t{1} << 40)) {
    return invalid_argument("session: add_chunk \"" + name + "\": elems must be 1..2^40, got " + std::to_string(elems));
  }
  if (name_used(name))
    return invalid_argument("session: add_chunk: a chunk or tensor is already named \"" + name + "\"");
  const DType t = dtype.value_or(options_.precision);
  STRATA_RETURN_IF_ERROR(check_chunk_dtype(t, options_.precision).with_context("session: add_chunk \"" + name + "\""));
  specs_.push_back({std::move(name), elems, std::move(init), t, {}});
  return specs_.size() - 1;
}

Status Session::set_chunk_dtype(size_t chunk, DType dtype) {
  STRATA_RETURN_IF_ERROR(registered("set_chunk_dtype", chunk));
  Spec& spec = specs_[chunk];
  if (started()) {
    return failed_precondition("session: set_chunk_dtype \"" + spec.name +
                               "\" after start: a chunk's working type is fixed once it is placed");
  }
  STRATA_RETURN_IF_ERROR(
      check_chunk_dtype(dtype, options_.precision).with_context("session: set_chunk_dtype \"" + spec.name + "\""));
  spec.dtype = dtype;
  return ok_status();
}

Status check_chunk_dtype(DType t, DType precision) {
  if (t != DType::kBF16 && t != DType::kF16 && t != DType::kF32) {
    return invalid_argument("a chunk's working type is bf16, fp16 or fp32, not " + std::string(dtype_name(t)));
  }
  if (t == DType::kF16 && precision != DType::kF16) {
    return invalid_argument("fp16 chunks need an fp16 session (precision fp16: the loss scale is the session's); " +
                            std::string("this one is ") + std::string(dtype_name(precision)));
  }
  return ok_status();
}

int64_t TensorView::elems() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool Session::name_used(const std::string& name) const {
  for (const Spec& s : specs_) {
    if (s.name == name) return true;
    for (const TensorView& t : s.tensors) {
      if (t.name == name) return true;
    }
  }
  return false;
}

Status Session::add_tensor(size_t chunk, TensorView t) {
  STRATA_RETURN_IF_ERROR(registered("add_tensor", chunk));
  Spec& spec = specs_[chunk];
  const std::string where = "session: add_tensor \"" + t.name + "\" in chunk \"" + spec.name + "\"";
  if (started()) return failed_precondition(where + ": after start");
  if (t.name.empty()) return invalid_argument("session: add_tensor: a tensor needs a name");
  if (name_used(t.name)) return invalid_argument(where + ": the name is already used");
  if (t.shape.empty() || t.shape.size() > 8) return invalid_argument(where + ": a shape has 1..8 dimensions");
  int64_t n = 1;
  for (int64_t d : t.shape) {
    if (d < 1 || d > spec.elems || n > spec.elems / d) {
      return invalid_argument(where + ": its shape does not fit in the chunk's " + std::to_string(spec.elems) +
                              " elements");
    }
    n *= d;
  }
  if (t.offset < 0 || t.offset > spec.elems - n) {
    return invalid_argument(where + ": elements " + std::to_string(t.offset) + ".." + std::to_string(t.offset + n) +
                            " pass the chunk's end (" + std::to_string(spec.elems) + ")");
  }
  for (const TensorView& o : spec.tensors) {
    if (t.offset < o.offset + o.elems() && o.offset < t.offset + n) {
      return invalid_argument(where + ": it overlaps \"" + o.name + "\"");
    }
  }
  auto at =
      std::find_if(spec.tensors.begin(), spec.tensors.end(), [&](const TensorView& o) { return o.offset > t.offset; });
  spec.tensors.insert(at, std::move(t));
  return ok_status();
}

}  // namespace strata::engine
