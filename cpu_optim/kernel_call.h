// Internal: what the tile kernels receive. One TileCall describes one
// contiguous tile of a span with every pointer already offset to the tile's
// first element (q8 scale pointers to its first block; tiles of q8 spans start
// on a kQ8BlockElems boundary). Coefficients that depend only on the step are
// computed once per call in optimizer.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu_optim/dtype.h"

namespace strata::cpu_optim::detail {

enum class OptKind : uint8_t { kAdam, kAdagrad, kLion, kSgd };

// Each rounded to fp32 once from the double hyper-parameters (optimizer.h).
struct Coeffs {
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  float one_minus_beta1 = 0, one_minus_beta2 = 0;
  float step_size = 0;       // Adam: lr / (1 - beta1^t); Adagrad: lr / (1 + (t-1) lr_decay)
  float bias_correction2_sqrt = 1;  // Adam: sqrt(1 - beta2^t)
  float decay = 1;           // decoupled weight decay factor 1 - lr * wd
  bool decoupled = true;     // Adam: AdamW
  float momentum = 0, one_minus_dampening = 1;
  bool nesterov = false;
  bool first_step = false;   // SGD: t == 1 initialises the momentum buffer
};

struct TileCall {
  OptKind kind = OptKind::kAdam;
  Coeffs c;
  float grad_scale = 1;
  float* params = nullptr;
  const void* grad = nullptr;
  DType grad_dtype = DType::kF32;
  void* out = nullptr;  // null: no low-precision copy
  DType out_dtype = DType::kBF16;
  StateType state_type = StateType::kF32;
  void* m = nullptr;
  void* v = nullptr;
  float* m_scale = nullptr;
  float* v_scale = nullptr;
  // Where the new params and states are written: the inputs themselves for
  // an update in place (optimizer.cpp always fills these in).
  float* params_next = nullptr;
  void* m_next = nullptr;
  void* v_next = nullptr;
  float* m_scale_next = nullptr;
  float* v_scale_next = nullptr;
  int64_t n = 0;
  // When set, the tile also computes the gradient's sum-of-squares partials
  // exactly as StatsKernel does (one per kGradStatsPartialElems elements from the
  // tile's start, which is a multiple of that; the last may be partial).
  // advanced() leaves it pointing at the tile's first partial.
  double* partials = nullptr;

  // The same call moved `by` elements on (a multiple of kQ8BlockElems for
  // q8 states, whose scale pointers move by whole blocks): every stream it
  // reads and writes, and n shortened to what is left.
  TileCall advanced(int64_t by) const {
    auto move = [by](auto* p, uint64_t elem_bytes) {
      using Ptr = decltype(p);
      using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<Ptr>>, const std::byte, std::byte>;
      return p == nullptr ? p : reinterpret_cast<Ptr>(reinterpret_cast<Byte*>(p) + by * elem_bytes);
    };
    auto blocks = [by](float* p) { return p == nullptr ? p : p + by / kQ8BlockElems; };
    const uint64_t sb = state_elem_bytes(state_type);
    TileCall t = *this;
    t.params = move(params, 4), t.params_next = move(params_next, 4);
    t.grad = move(grad, dtype_bytes(grad_dtype));
    t.out = move(out, dtype_bytes(out_dtype));
    t.m = move(m, sb), t.v = move(v, sb), t.m_next = move(m_next, sb), t.v_next = move(v_next, sb);
    t.m_scale = blocks(m_scale), t.v_scale = blocks(v_scale);
    t.m_scale_next = blocks(m_scale_next), t.v_scale_next = blocks(v_scale_next);
    t.n = n - by;
    return t;
  }
};

// Which state arrays an optimizer reads and writes.
inline bool uses_m(OptKind k, const Coeffs& c) {
  return k == OptKind::kAdam || k == OptKind::kLion || (k == OptKind::kSgd && c.momentum != 0.0f);
}
inline bool uses_v(OptKind k) { return k == OptKind::kAdam || k == OptKind::kAdagrad; }

// Returns the number of non-finite gradient elements seen in the tile.
// native_bf16 (Isa::kAvx512Bf16 sets it; the AVX-512 kernels are compiled
// with -mavx512bf16, and the instruction runs only where the CPU has it):
// round fp32 to bf16 with AVX-512 BF16's vcvtneps2bf16, which rounds to
// nearest even and quiets NaN as f32_to_bf16 does but flushes subnormal
// inputs to zero — a batch holding one takes the integer path, so the bits
// never differ. A member, not a thread-local: the hot loop reads it once.
struct TileKernel {
  bool native_bf16 = false;
  template <class Arch>
  int64_t operator()(Arch, const TileCall& call) const;
};

// Sum of squares of scale*g (inf/nan elements excluded) for each kSub-element
// sub-tile of [0, n) into partials[i], and the count of inf/nan elements.
// Partials depend only on the data, so summing them in order is deterministic.
struct StatsKernel {
  template <class Arch>
  void operator()(Arch, const void* grad, DType dtype, int64_t n, float scale, double* partials,
                  int64_t* nonfinite) const;
};

// Conversions exposed for tests (bitwise equality with dtype.h's scalar ones).
struct ConvertKernel {
  template <class Arch>
  void operator()(Arch, const void* src, DType src_type, void* dst, DType dst_type, int64_t n) const;
};

// The 8-bit state format on its own (q8.h): n values <-> codes and one scale
// per kQ8BlockElems, block by block. `is_v` picks v's format over m's.
struct Q8EncodeKernel {
  template <class Arch>
  void operator()(Arch, const float* src, int64_t n, bool is_v, void* codes, float* scales) const;
};
struct Q8DecodeKernel {
  template <class Arch>
  void operator()(Arch, const void* codes, const float* scales, int64_t n, bool is_v, float* dst) const;
};

// The scalar reference step over one span (optim_ref.cpp); returns non-finite count.
int64_t reference_tile(const TileCall& call);
void reference_q8_encode(const float* src, int64_t n, bool is_v, void* codes, float* scales);
void reference_q8_decode(const void* codes, const float* scales, int64_t n, bool is_v, float* dst);
void reference_stats(const void* grad, DType dtype, int64_t n, float scale, double* partials, int64_t* nonfinite);

}  // namespace strata::cpu_optim::detail
