// Validation, per-step coefficients, ISA selection and tiling for cpu_optim.
#include "cpu_optim/optimizer.h"

#include <cpuid.h>
#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>

#include "common/units.h"
#include "cpu_optim/executor.h"
#include "cpu_optim/kernel_call.h"

namespace strata::cpu_optim {
namespace {

using detail::Coeffs;
using detail::OptKind;
using detail::TileCall;

constexpr int64_t kTileQuantum = 4096;  // tiles are multiples of this (and so of the q8 block and sub-tile)

// A hyper-parameter as a message shows it: the shortest text that reads
// back as the same number (std::to_string would print 1e-9 as 0.000000).
template <class T>
std::string shown(T x) {
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

Status check_unit(double x, const char* name, bool allow_one = false) {
  if (!(x >= 0.0 && (allow_one ? x <= 1.0 : x < 1.0))) {
    return invalid_argument(std::string(name) + " must be in [0, " + (allow_one ? "1]" : "1)") + ", got " + shown(x));
  }
  return ok_status();
}

// Finite and >= 0, and finite as the fp32 it is rounded to.
Status check_nonneg(double x, const char* name) {
  if (!(x >= 0.0) || !std::isfinite(static_cast<float>(x))) {
    return invalid_argument(std::string(name) + " must be finite and >= 0 (at most " +
                            shown(std::numeric_limits<float>::max()) + "), got " + shown(x));
  }
  return ok_status();
}

float f32(double x) {
  return static_cast<float>(x);
}

// Builds the per-step coefficients, validating the hyper-parameters: each
// computed in double from the double hyper-parameters and rounded to fp32
// once, as torch.optim's scalars are (optimizer.h).
Result<std::pair<OptKind, Coeffs>> coefficients(const OptimizerConfig& config, int64_t t) {
  Coeffs c;
  const double td = static_cast<double>(t);
  if (const auto* a = std::get_if<AdamConfig>(&config)) {
    STRATA_RETURN_IF_ERROR(check_nonneg(a->lr, "adam lr"));
    STRATA_RETURN_IF_ERROR(check_unit(a->beta1, "adam beta1"));
    STRATA_RETURN_IF_ERROR(check_unit(a->beta2, "adam beta2"));
    STRATA_RETURN_IF_ERROR(check_nonneg(a->eps, "adam eps"));
    STRATA_RETURN_IF_ERROR(check_nonneg(a->weight_decay, "adam weight_decay"));
    c.lr = f32(a->lr), c.beta1 = f32(a->beta1), c.beta2 = f32(a->beta2), c.eps = f32(a->eps);
    c.weight_decay = f32(a->weight_decay);
    c.one_minus_beta1 = f32(1.0 - a->beta1);
    c.one_minus_beta2 = f32(1.0 - a->beta2);
    const double bc1 = 1.0 - std::pow(a->beta1, td), bc2 = 1.0 - std::pow(a->beta2, td);
    c.step_size = f32(a->lr / bc1);
    c.bias_correction2_sqrt = f32(std::sqrt(bc2));
    c.decoupled = a->decoupled_weight_decay;
    c.decay = a->decoupled_weight_decay ? f32(1.0 - a->lr * a->weight_decay) : 1.0f;
    return std::make_pair(OptKind::kAdam, c);
  }
  if (const auto* a = std::get_if<AdagradConfig>(&config)) {
    STRATA_RETURN_IF_ERROR(check_nonneg(a->lr, "adagrad lr"));
    STRATA_RETURN_IF_ERROR(check_nonneg(a->lr_decay, "adagrad lr_decay"));
    STRATA_RETURN_IF_ERROR(check_nonneg(a->eps, "adagrad eps"));
    STRATA_RETURN_IF_ERROR(check_nonneg(a->weight_decay, "adagrad weight_decay"));
    c.lr = f32(a->lr), c.eps = f32(a->eps), c.weight_decay = f32(a->weight_decay);
    c.step_size = f32(a->lr / (1.0 + (td - 1.0) * a->lr_decay));
    return std::make_pair(OptKind::kAdagrad, c);
  }
  if (const auto* a = std::get_if<LionConfig>(&config)) {
    STRATA_RETURN_IF_ERROR(check_nonneg(a->lr, "lion lr"));
    STRATA_RETURN_IF_ERROR(check_unit(a->beta1, "lion beta1", true));
    STRATA_RETURN_IF_ERROR(check_unit(a->beta2, "lion beta2", true));
    STRATA_RETURN_IF_ERROR(check_nonneg(a->weight_decay, "lion weight_decay"));
    c.lr = f32(a->lr), c.beta1 = f32(a->beta1), c.beta2 = f32(a->beta2), c.weight_decay = f32(a->weight_decay);
    c.one_minus_beta1 = f32(1.0 - a->beta1);
    c.one_minus_beta2 = f32(1.0 - a->beta2);
    c.decay = f32(1.0 - a->lr * a->weight_decay);
    return std::make_pair(OptKind::kLion, c);
  }
  const auto& s = std::get<SgdConfig>(config);
  STRATA_RETURN_IF_ERROR(check_nonneg(s.lr, "sgd lr"));
  STRATA_RETURN_IF_ERROR(check_nonneg(s.momentum, "sgd momentum"));
  STRATA_RETURN_IF_ERROR(check_unit(s.dampening, "sgd dampening", true));
  STRATA_RETURN_IF_ERROR(check_nonneg(s.weight_decay, "sgd weight_decay"));
  if (s.nesterov && (s.momentum <= 0.0 || s.dampening != 0.0)) {
    return invalid_argument("sgd nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
  }
  c.lr = f32(s.lr), c.weight_decay = f32(s.weight_decay), c.momentum = f32(s.momentum);
  c.one_minus_dampening = f32(1.0 - s.dampening);
  c.nesterov = s.nesterov;
  c.first_step = t == 1;
  return std::make_pair(OptKind::kSgd, c);
}

// What the CPU and the OS support of what the kernels' flags ask for: the
// CPUID feature bits, and whether the OS saves the registers they use (the
// XCR0 bits for the YMM state, and for AVX-512's opmask and ZMM states;
// without them the instructions fault). Read directly: xsimd's probe
// (available_architectures) checks no XCR0 and names neither F16C nor
// AVX-512 BF16, and __builtin_cpu_supports's feature names differ between
// compilers (clang 14 knows no "f16c"). SSE2 is part of x86-64 itself.
struct CpuFeatures {
  bool fma = false, f16c = false, avx2 = false, avx512f = false, avx512dq = false, avx512cd = false, avx512bw = false,
       avx512vl = false, avx512_bf16 = false;
  bool os_ymm = false, os_zmm = false;
};
CpuFeatures cpu_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  auto bit = [](unsigned reg, int k) { return ((reg >> k) & 1U) != 0; };
  if (__get_cpuid_count(1, 0, &a, &b, &c, &d) != 0) {
    f.fma = bit(c, 12);
    f.f16c = bit(c, 29);
    if (bit(c, 27)) {  // OSXSAVE: XGETBV may be executed
      unsigned xcr0 = 0, high = 0;
      __asm__("xgetbv" : "=a"(xcr0), "=d"(high) : "c"(0));
      f.os_ymm = (xcr0 & 0x6U) == 0x6U;    // SSE and AVX state
      f.os_zmm = (xcr0 & 0xe6U) == 0xe6U;  // and opmask, ZMM0-15 upper halves, ZMM16-31
    }
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) != 0) {
    const unsigned subleaves = a;
    f.avx2 = bit(b, 5);
    f.avx512f = bit(b, 16);
    f.avx512dq = bit(b, 17);
    f.avx512cd = bit(b, 28);
    f.avx512bw = bit(b, 30);
    f.avx512vl = bit(b, 31);
    if (subleaves >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0) f.avx512_bf16 = bit(a, 5);
  }
  return f;
}

Result<Isa> resolve_isa(Isa requested) {
  // The CPU does not change under a running process: probe it once (every
  // optimizer call resolves its instruction set).
  static const std::vector<Isa> have = available_isas();
  if (requested == Isa::kAuto) return have.front();
  for (Isa i : have) {
    if (i == requested) return i;
  }
  return unimplemented(std::string("instruction set ") + std::string(isa_name(requested)) +
                       " is not supported by this CPU or not compiled in");
}

// kernel(arch, args...) with the vector kernels `isa` names (resolved), or
// reference(args...) for Isa::kScalar.
template <class Kernel, class Reference, class... Args>
auto on_isa(Isa isa, const Kernel& kernel, const Reference& reference, const Args&... args) {
  switch (isa) {
    case Isa::kAvx512: return kernel(xsimd::avx512bw{}, args...);
    case Isa::kAvx512Bf16:
      if constexpr (requires { kernel.native_bf16; }) {
        Kernel native = kernel;
        native.native_bf16 = true;
        return native(xsimd::avx512bw{}, args...);
      } else {
        return kernel(xsimd::avx512bw{}, args...);
      }
    case Isa::kAvx2: return kernel(xsimd::fma3<xsimd::avx2>{}, args...);
    case Isa::kSse2: return kernel(xsimd::sse2{}, args...);
    default: return reference(args...);
  }
}

int64_t run_tile(Isa isa, const TileCall& call) {
  return on_isa(isa, detail::TileKernel{}, detail::reference_tile, call);
}

void run_stats(Isa isa, const void* grad, DType dtype, int64_t n, float scale, double* partials, int64_t* bad) {
  on_isa(isa, detail::StatsKernel{}, detail::reference_stats, grad, dtype, n, scale, partials, bad);
}

// The scalar twin of ConvertKernel: dtype.h's conversions one element at a time.
void reference_convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float x = src_type == DType::kF32    ? static_cast<const float*>(src)[i]
              : src_type == DType::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(src)[i])
                                         : f16_to_f32(static_cast<const uint16_t*>(src)[i]);
    if (dst_type == DType::kF32) {
      static_cast<float*>(dst)[i] = x;
    } else {
      static_cast<uint16_t*>(dst)[i] = dst_type == DType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x);
    }
  }
}

// One buffer a call reads or writes.
struct Extent {
  const char* name;
  const void* p;
  uint64_t bytes;
  uint64_t align;  // the size of its elements
  bool written;
};

// Each buffer aligned to its elements, and none that the call writes
// sharing a byte with another it reads or writes: the kernels read and
// write in batches and passes, so an overlap would not be an error they
// could see, only wrong numbers. Null or empty buffers are skipped.
Status check_extents(const char* call, std::initializer_list<Extent> extents) {
  for (auto a = extents.begin(); a != extents.end(); ++a) {
    if (a->p == nullptr || a->bytes == 0) continue;
    const auto a0 = reinterpret_cast<uintptr_t>(a->p);
    if (a0 % a->align != 0) {
      return invalid_argument(std::string(call) + ": " + a->name + " is not aligned to its " +
                              std::to_string(a->align) + "-byte elements");
    }
    for (auto b = extents.begin(); b != a; ++b) {
      if (b->p == nullptr || b->bytes == 0 || !(a->written || b->written)) continue;
      const auto b0 = reinterpret_cast<uintptr_t>(b->p);
      if (a0 < b0 + b->bytes && b0 < a0 + a->bytes) {
        return invalid_argument(std::string(call) + ": " + b->name + " and " + a->name +
                                " overlap; a buffer the call writes must share no memory with another it reads or "
                                "writes");
      }
    }
  }
  return ok_status();
}

// The bytes of an 8-bit state array's block scales (one float per block).
uint64_t q8_scale_bytes(uint64_t n) {
  return 4 * div_ceil(n, kQ8BlockElems);
}

// The buffers of one step: in place, params and the states are read and
// written; out of place, read, and their _next twins (null in place)
// written. Arrays the optimizer does not use count as empty.
Status check_span_extents(const ParamSpan& span, bool need_m, bool need_v) {
  const auto n = static_cast<uint64_t>(span.n);
  const bool in_place = span.params_next == nullptr;
  const uint64_t elem = state_elem_bytes(span.state.type);
  const uint64_t scales = span.state.type == StateType::kQ8 ? q8_scale_bytes(n) : 0;
  const uint64_t m_bytes = need_m ? elem * n : 0, v_bytes = need_v ? elem * n : 0;
  const uint64_t m_scales = need_m ? scales : 0, v_scales = need_v ? scales : 0;
  const uint64_t g = dtype_bytes(span.grad_dtype), out = dtype_bytes(span.out_dtype);
  const StateSpans& s = span.state;
  const StateSpans& x = span.state_next;
  return check_extents("optimizer step", {{"grad", span.grad, g * n, g, false},
                                          {"weights_out", span.weights_out, out * n, out, true},
                                          {"params", span.params, 4 * n, 4, in_place},
                                          {"m", s.m, m_bytes, elem, in_place},
                                          {"v", s.v, v_bytes, elem, in_place},
                                          {"m_scale", s.m_scale, m_scales, 4, in_place},
                                          {"v_scale", s.v_scale, v_scales, 4, in_place},
                                          {"params_next", span.params_next, 4 * n, 4, true},
                                          {"state_next.m", x.m, m_bytes, elem, true},
                                          {"state_next.v", x.v, v_bytes, elem, true},
                                          {"state_next.m_scale", x.m_scale, m_scales, 4, true},
                                          {"state_next.v_scale", x.v_scale, v_scales, 4, true}});
}

Status validate_span(const ParamSpan& span, OptKind kind, const Coeffs& c) {
  if (span.n < 0) return invalid_argument("span has negative length " + std::to_string(span.n));
  if (span.n == 0) return ok_status();
  if (span.params == nullptr || span.grad == nullptr) return invalid_argument("span params/grad pointer is null");
  bool need_m = detail::uses_m(kind, c), need_v = detail::uses_v(kind);
  if ((need_m && span.state.m == nullptr) || (need_v && span.state.v == nullptr)) {
    return invalid_argument("optimizer state pointer is null (m needed: " + std::to_string(need_m) +
                            ", v needed: " + std::to_string(need_v) + ")");
  }
  if (span.state.type != StateType::kF32 && kind != OptKind::kAdam) {
    return invalid_argument(std::string(state_type_name(span.state.type)) +
                            " optimizer states are implemented for Adam/AdamW only");
  }
  if (span.state.type == StateType::kQ8 && (span.state.m_scale == nullptr || span.state.v_scale == nullptr)) {
    return invalid_argument("q8 optimizer states need m_scale and v_scale arrays (ceil(n / 256) floats each)");
  }
  const StateSpans& next = span.state_next;
  const bool any_next = next.m != nullptr || next.v != nullptr || next.m_scale != nullptr || next.v_scale != nullptr;
  if (span.params_next == nullptr) {
    if (any_next) return invalid_argument("state_next is given without params_next (an update out of place needs both)");
    return check_span_extents(span, need_m, need_v);
  }
  if (next.type != span.state.type) {
    return invalid_argument(std::string("state_next is ") + std::string(state_type_name(next.type)) + " but state is " +
                            std::string(state_type_name(span.state.type)));
  }
  if ((need_m && next.m == nullptr) || (need_v && next.v == nullptr) ||
      (next.type == StateType::kQ8 && (next.m_scale == nullptr || next.v_scale == nullptr))) {
    return invalid_argument("state_next lacks an array the update writes (m needed: " + std::to_string(need_m) +
                            ", v needed: " + std::to_string(need_v) + ")");
  }
  return check_span_extents(span, need_m, need_v);
}

}  // namespace

Result<StateType> parse_state_type(std::string_view name) {
  for (StateType t : {StateType::kF32, StateType::kBF16, StateType::kQ8}) {
    if (name == state_type_name(t)) return t;
  }
  return invalid_argument("optimizer state type '" + std::string(name) + "': expected fp32, bf16 or q8");
}

std::string_view state_type_name(StateType t) {
  switch (t) {
    case StateType::kF32: return "fp32";
    case StateType::kBF16: return "bf16";
    case StateType::kQ8: return "q8";
  }
  return "?";
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAuto: return "auto";
    case Isa::kScalar: return "scalar";
    case Isa::kSse2: return "sse2";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512_bf16";
  }
  return "?";
}

Result<Isa> parse_isa(std::string_view name) {
  for (Isa i : {Isa::kAuto, Isa::kScalar, Isa::kSse2, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    if (name == isa_name(i)) return i;
  }
  return invalid_argument("instruction set '" + std::string(name) +
                          "': expected auto, avx512_bf16, avx512, avx2, sse2 or scalar");
}

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  const CpuFeatures f = cpu_features();
  // What kernels_avx512.cpp and kernels_avx2.cpp are built with (cpu_optim/CMakeLists.txt).
  const bool avx2 = f.os_ymm && f.avx2 && f.fma && f.f16c;
  const bool avx512 = f.os_zmm && avx2 && f.avx512f && f.avx512bw && f.avx512dq && f.avx512cd && f.avx512vl;
  if (avx512 && f.avx512_bf16) out.push_back(Isa::kAvx512Bf16);
  if (avx512) out.push_back(Isa::kAvx512);
  if (avx2) out.push_back(Isa::kAvx2);
  out.push_back(Isa::kSse2);
  out.push_back(Isa::kScalar);
  return out;
}

std::string_view optimizer_name(const OptimizerConfig& config) {
  if (const auto* a = std::get_if<AdamConfig>(&config)) return a->decoupled_weight_decay ? "adamw" : "adam";
  if (std::holds_alternative<AdagradConfig>(config)) return "adagrad";
  if (std::holds_alternative<LionConfig>(config)) return "lion";
  return "sgd";
}

int state_count(const OptimizerConfig& config) {
  if (std::holds_alternative<AdamConfig>(config)) return 2;
  if (const auto* s = std::get_if<SgdConfig>(&config))
    return static_cast<float>(s->momentum) != 0.0f ? 1 : 0;  // as the kernels see it
  return 1;
}

uint64_t state_array_bytes(StateType type, int64_t n) {
  uint64_t count = static_cast<uint64_t>(n);
  switch (type) {
    case StateType::kF32: return 4 * count;
    case StateType::kBF16: return 2 * count;
    case StateType::kQ8:
      return count + q8_scale_bytes(count);
  }
  return 0;
}

namespace {
Status check_convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n) {
  if (n < 0 || (n > 0 && (src == nullptr || dst == nullptr))) return invalid_argument("convert: null pointer or n < 0");
  const uint64_t sb = dtype_bytes(src_type), db = dtype_bytes(dst_type), count = static_cast<uint64_t>(n);
  return check_extents("convert", {{"src", src, sb * count, sb, false}, {"dst", dst, db * count, db, true}});
}
}  // namespace

Status convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n, Isa isa) {
  STRATA_RETURN_IF_ERROR(check_convert(src, src_type, dst, dst_type, n));
  STRATA_ASSIGN_OR_RETURN(Isa chosen, resolve_isa(isa));
  on_isa(chosen, detail::ConvertKernel{}, reference_convert, src, src_type, dst, dst_type, n);
  return ok_status();
}

Status convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n, Executor& executor, Isa isa) {
  STRATA_RETURN_IF_ERROR(check_convert(src, src_type, dst, dst_type, n));
  STRATA_ASSIGN_OR_RETURN(Isa chosen, resolve_isa(isa));
  const uint64_t sb = dtype_bytes(src_type), db = dtype_bytes(dst_type);
  executor.parallel_for(n, kTileQuantum * 16, [&](int64_t begin, int64_t end) {
    on_isa(chosen, detail::ConvertKernel{}, reference_convert, static_cast<const std::byte*>(src) + begin * sb,
           src_type, static_cast<void*>(static_cast<std::byte*>(dst) + begin * db), dst_type, end - begin);
  });
  return ok_status();
}

Status q8_encode(const float* src, int64_t n, Q8Array which, void* codes, float* scales, Isa isa) {
  if (n < 0 || (n > 0 && (src == nullptr || codes == nullptr || scales == nullptr))) {
    return invalid_argument("q8_encode: null pointer or n < 0");
  }
  const auto count = static_cast<uint64_t>(n), scale_bytes = q8_scale_bytes(count);
  STRATA_RETURN_IF_ERROR(check_extents(
      "q8_encode",
      {{"src", src, 4 * count, 4, false}, {"codes", codes, count, 1, true}, {"scales", scales, scale_bytes, 4, true}}));
  STRATA_ASSIGN_OR_RETURN(Isa chosen, resolve_isa(isa));
  on_isa(chosen, detail::Q8EncodeKernel{}, detail::reference_q8_encode, src, n, which == Q8Array::kV, codes, scales);
  return ok_status();
}

Status q8_decode(const void* codes, const float* scales, int64_t n, Q8Array which, float* dst, Isa isa) {
  if (n < 0 || (n > 0 && (codes == nullptr || scales == nullptr || dst == nullptr))) {
    return invalid_argument("q8_decode: null pointer or n < 0");
  }
  const auto count = static_cast<uint64_t>(n), scale_bytes = q8_scale_bytes(count);
  STRATA_RETURN_IF_ERROR(check_extents("q8_decode", {{"codes", codes, count, 1, false},
                                                     {"scales", scales, scale_bytes, 4, false},
                                                     {"dst", dst, 4 * count, 4, true}}));
  STRATA_ASSIGN_OR_RETURN(Isa chosen, resolve_isa(isa));
  on_isa(chosen, detail::Q8DecodeKernel{}, detail::reference_q8_decode, codes, scales, n, which == Q8Array::kV, dst);
  return ok_status();
}

namespace {
// Reusable partials for the calling thread (grad_stats and step run once per
// chunk or piece every training step: no allocation each time). Two, since
// step() may call grad_stats().
std::vector<double>& partials_buffer(bool for_step, int64_t n) {
  thread_local std::vector<double> grad_stats_partials, step_partials;
  std::vector<double>& v = for_step ? step_partials : grad_stats_partials;
  v.assign(static_cast<size_t>(div_ceil(static_cast<uint64_t>(n), kGradStatsPartialElems)), 0.0);
  return v;
}
}  // namespace

Result<GradStats> grad_stats(const void* grad, DType dtype, int64_t n, float grad_scale, Executor& executor,
                             Isa isa) {
  if (n < 0 || (n > 0 && grad == nullptr)) return invalid_argument("grad_stats: null gradient or negative length");
  if (!std::isfinite(grad_scale))
    return invalid_argument("grad_stats: grad_scale must be finite, got " + shown(grad_scale));
  STRATA_RETURN_IF_ERROR(check_extents(
      "grad_stats", {{"grad", grad, dtype_bytes(dtype) * static_cast<uint64_t>(n), dtype_bytes(dtype), false}}));
  STRATA_ASSIGN_OR_RETURN(Isa chosen, resolve_isa(isa));
  std::vector<double>& partials = partials_buffer(false, n);  // the caller's thread's: the workers fill it
  std::atomic<int64_t> bad{0};
  const uint64_t elem = dtype_bytes(dtype);
  executor.parallel_for(n, 64 * kGradStatsPartialElems, [&](int64_t begin, int64_t end) {
    int64_t tile_bad = 0;
    run_stats(chosen, static_cast<const std::byte*>(grad) + begin * elem, dtype, end - begin, grad_scale,
              partials.data() + begin / kGradStatsPartialElems, &tile_bad);
    bad.fetch_add(tile_bad, std::memory_order_relaxed);
  });
  GradStats stats;
  for (double p : partials) stats.sum_squares += p;  // in order: deterministic
  stats.nonfinite = bad.load();
  return stats;
}

Status validate(const OptimizerConfig& config) {
  return coefficients(config, 1).status();
}

Result<StepReport> step(const OptimizerConfig& config, int64_t t, const ParamSpan& span, const StepOptions& options,
                        Executor& executor) {
  if (t < 1) return invalid_argument("optimizer step count must be >= 1, got " + std::to_string(t));
  if (!std::isfinite(options.grad_scale)) {
    return invalid_argument("optimizer step: grad_scale must be finite, got " + shown(options.grad_scale));
  }
  if (options.tile_elems <= 0) {
    return invalid_argument("optimizer step: tile_elems must be > 0, got " + std::to_string(options.tile_elems));
  }
  STRATA_ASSIGN_OR_RETURN(auto kc, coefficients(config, t));
  auto [kind, coeffs] = kc;
  STRATA_RETURN_IF_ERROR(validate_span(span, kind, coeffs));
  STRATA_ASSIGN_OR_RETURN(Isa isa, resolve_isa(options.isa));
  StepReport report;
  if (span.n == 0) return report;
  // The statistics come from the pre-pass when there is one, else from the
  // update's own read of the gradient (TileCall::partials).
  std::vector<double>* partials = nullptr;  // the caller's thread's buffer, filled by the workers
  if (options.nonfinite == NonFinitePolicy::kSkipStep) {
    const float scale = options.stats != nullptr ? options.grad_scale : 1.0f;  // the count does not depend on it
    STRATA_ASSIGN_OR_RETURN(GradStats stats, grad_stats(span.grad, span.grad_dtype, span.n, scale, executor, isa));
    if (options.stats != nullptr) {
      options.stats->sum_squares += stats.sum_squares;
      options.stats->nonfinite += stats.nonfinite;
    }
    if (stats.nonfinite > 0) {
      report.nonfinite = stats.nonfinite;
      report.skipped = true;
      return report;
    }
  } else if (options.stats != nullptr) {
    partials = &partials_buffer(true, span.n);
  }
  // A tile longer than the span is the span (no result depends on the
  // tiling, and round_up of a near-INT64_MAX tile would wrap to 0).
  const auto tile = static_cast<int64_t>(
      round_up(static_cast<uint64_t>(std::min(options.tile_elems, span.n)), static_cast<uint64_t>(kTileQuantum)));
  // The whole span as one call; each tile is it moved on to the tile's start.
  TileCall whole;
  whole.kind = kind;
  whole.c = coeffs;
  whole.grad_scale = options.grad_scale;
  whole.params = span.params;
  whole.grad = span.grad;
  whole.grad_dtype = span.grad_dtype;
  // An fp32 copy is the new params themselves: the kernels write none, and
  // each tile copies its params once updated (below), while in cache.
  const bool copy_out = span.weights_out != nullptr && span.out_dtype == DType::kF32;
  whole.out = copy_out ? nullptr : span.weights_out;
  whole.out_dtype = span.out_dtype;
  whole.state_type = span.state.type;
  whole.m = span.state.m, whole.v = span.state.v;
  whole.m_scale = span.state.m_scale, whole.v_scale = span.state.v_scale;
  const bool in_place = span.params_next == nullptr;
  const StateSpans& next = in_place ? span.state : span.state_next;
  whole.params_next = in_place ? span.params : span.params_next;
  whole.m_next = next.m, whole.v_next = next.v;
  whole.m_scale_next = next.m_scale, whole.v_scale_next = next.v_scale;
  whole.n = span.n;
  std::atomic<int64_t> bad{0};
  static_assert(kTileQuantum % kGradStatsPartialElems == 0, "tiles start on a partial");
  executor.parallel_for(span.n, tile, [&](int64_t begin, int64_t end) {
    TileCall call = whole.advanced(begin);
    call.n = end - begin;
    if (partials != nullptr) call.partials = partials->data() + begin / kGradStatsPartialElems;
    int64_t k = run_tile(isa, call);
    if (k != 0) bad.fetch_add(k, std::memory_order_relaxed);
    if (copy_out) {
      std::memcpy(static_cast<float*>(span.weights_out) + begin, call.params_next, static_cast<size_t>(call.n) * 4);
    }
  });
  report.nonfinite = bad.load();
  if (partials != nullptr) {
    for (double p : *partials) options.stats->sum_squares += p;  // in order, as grad_stats sums
    options.stats->nonfinite += report.nonfinite;
  }
  return report;
}

}  // namespace strata::cpu_optim
