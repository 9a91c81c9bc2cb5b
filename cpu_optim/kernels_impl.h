// The vector kernels, written once against xsimd::batch<float, Arch> and
// instantiated per instruction set in kernels_<isa>.cpp (each compiled with
// that ISA's flags). xsimd::dispatch picks one at run time.
//
// Each tile is processed in sub-tiles of kSub elements: inputs are converted
// into L1-resident fp32 scratch (zero-padded to whole vectors, so the tail of
// a span runs the same vector code as the bulk), the update runs on whole
// batches, and results are converted back out. Every byte of the span's
// streams is read or written from memory exactly once.
#pragma once

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <type_traits>

#include "cpu_optim/kernel_call.h"
#include "cpu_optim/q8.h"

namespace strata::cpu_optim::detail {

inline constexpr int64_t kSub = 1024;  // multiple of kQ8BlockElems and of every vector width
static_assert(kSub % kQ8BlockElems == 0);
static_assert(kSub == kStatsPartialElems);

template <class Arch>
constexpr bool has_f16c() {
  return std::is_base_of_v<xsimd::avx2, Arch> || std::is_base_of_v<xsimd::avx512f, Arch>;
}

template <class Arch>
void to_f32(const void* src, DType type, int64_t n, float* __restrict dst) {
  if (type == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  } else if (type == DType::kBF16) {
    const auto* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(uint32_t{s[i]} << 16);
  } else if constexpr (has_f16c<Arch>()) {
    const auto* s = static_cast<const _Float16*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
  } else {
    const auto* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
  }
}

template <class Arch>
void from_f32(const float* __restrict src, DType type, int64_t n, void* dst) {
  if (type == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  } else if (type == DType::kBF16) {
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) {
      uint32_t u = std::bit_cast<uint32_t>(src[i]);
      uint16_t rounded = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
      d[i] = (u & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>((u >> 16) | 0x40u) : rounded;
    }
  } else if constexpr (has_f16c<Arch>()) {
    auto* d = static_cast<_Float16*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<_Float16>(src[i]);
  } else {
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
  }
}

// 8-bit blockwise states (format in q8.h): decode a sub-tile's blocks into
// fp32 scratch, and encode them back with fresh per-block scales.
inline void q8_load(const void* q, const float* scales, bool is_v, int64_t n, float* __restrict dst) {
  for (int64_t b = 0; b * kQ8BlockElems < n; ++b) {
    int64_t begin = b * kQ8BlockElems, end = std::min(n, begin + kQ8BlockElems);
    float scale = scales[b];
    if (is_v) {
      const auto* s = static_cast<const uint8_t*>(q);
      for (int64_t i = begin; i < end; ++i) dst[i] = q8_v_decode(s[i], scale);
    } else {
      const auto* s = static_cast<const int8_t*>(q);
      for (int64_t i = begin; i < end; ++i) dst[i] = q8_m_decode(s[i], scale);
    }
  }
}

inline void q8_store(const float* __restrict src, bool is_v, int64_t n, void* q, float* scales) {
  for (int64_t b = 0; b * kQ8BlockElems < n; ++b) {
    int64_t begin = b * kQ8BlockElems, end = std::min(n, begin + kQ8BlockElems);
    float scale = 0;
    if (is_v) {
      for (int64_t i = begin; i < end; ++i) scale = std::max(scale, q8_v_scale_of(src[i]));
      auto* d = static_cast<uint8_t*>(q);
      for (int64_t i = begin; i < end; ++i) d[i] = q8_v_encode(src[i], scale);
    } else {
      for (int64_t i = begin; i < end; ++i) scale = std::max(scale, q8_m_scale_of(src[i]));
      auto* d = static_cast<int8_t*>(q);
      for (int64_t i = begin; i < end; ++i) d[i] = q8_m_encode(src[i], scale);
    }
    scales[b] = scale;
  }
}

template <class Arch>
int64_t count_nonfinite(const xsimd::batch<float, Arch>& g) {
  using B = xsimd::batch<float, Arch>;
  // Not `g != g`: some ISAs compare ordered, so NaN != NaN would be false.
  auto bad = !xsimd::isfinite(g);
  if (!xsimd::any(bad)) return 0;
  alignas(64) float lanes[B::size];
  g.store_aligned(lanes);
  int64_t n = 0;
  for (float x : lanes) n += !(std::fabs(x) <= FLT_MAX);
  return n;
}

// The updates, on zero-padded fp32 scratch of `n` (a multiple of the width).
template <class Arch>
int64_t update(const TileCall& call, float* p, const float* g, float* m, float* v, int64_t n) {
  using B = xsimd::batch<float, Arch>;
  constexpr int64_t W = B::size;
  const Coeffs& c = call.c;
  const B gs(call.grad_scale);
  int64_t nonfinite = 0;
  switch (call.kind) {
    case OptKind::kAdam:
      for (int64_t i = 0; i < n; i += W) {
        B graw = B::load_aligned(g + i);
        nonfinite += count_nonfinite<Arch>(graw);
        B pp = B::load_aligned(p + i);
        B gg = graw * gs;
        if (!c.decoupled) gg = xsimd::fma(B(c.weight_decay), pp, gg);
        B mm = xsimd::fma(B(c.beta1), B::load_aligned(m + i), B(c.one_minus_beta1) * gg);
        B vv = xsimd::fma(B(c.beta2), B::load_aligned(v + i), B(c.one_minus_beta2) * gg * gg);
        B denom = xsimd::sqrt(vv) / B(c.bias_correction2_sqrt) + B(c.eps);
        if (c.decoupled) pp = pp * B(c.decay);
        pp = xsimd::fnma(B(c.step_size), mm / denom, pp);
        pp.store_aligned(p + i);
        mm.store_aligned(m + i);
        vv.store_aligned(v + i);
      }
      break;
    case OptKind::kAdagrad:
      for (int64_t i = 0; i < n; i += W) {
        B graw = B::load_aligned(g + i);
        nonfinite += count_nonfinite<Arch>(graw);
        B pp = B::load_aligned(p + i);
        B gg = xsimd::fma(B(c.weight_decay), pp, graw * gs);
        B ss = xsimd::fma(gg, gg, B::load_aligned(v + i));
        pp = xsimd::fnma(B(c.step_size), gg / (xsimd::sqrt(ss) + B(c.eps)), pp);
        pp.store_aligned(p + i);
        ss.store_aligned(v + i);
      }
      break;
    case OptKind::kLion:
      for (int64_t i = 0; i < n; i += W) {
        B graw = B::load_aligned(g + i);
        nonfinite += count_nonfinite<Arch>(graw);
        B gg = graw * gs;
        B mm = B::load_aligned(m + i);
        B cc = xsimd::fma(B(c.beta1), mm, B(c.one_minus_beta1) * gg);
        B sign = xsimd::select(cc > B(0.0f), B(1.0f), xsimd::select(cc < B(0.0f), B(-1.0f), B(0.0f)));
        B pp = xsimd::fnma(B(c.lr), sign, B::load_aligned(p + i) * B(c.decay));
        mm = xsimd::fma(B(c.beta2), mm, B(c.one_minus_beta2) * gg);
        pp.store_aligned(p + i);
        mm.store_aligned(m + i);
      }
      break;
    case OptKind::kSgd:
      for (int64_t i = 0; i < n; i += W) {
        B graw = B::load_aligned(g + i);
        nonfinite += count_nonfinite<Arch>(graw);
        B pp = B::load_aligned(p + i);
        B gg = xsimd::fma(B(c.weight_decay), pp, graw * gs);
        if (c.momentum != 0.0f) {
          B buf = c.first_step ? gg : xsimd::fma(B(c.momentum), B::load_aligned(m + i), B(1.0f - c.dampening) * gg);
          buf.store_aligned(m + i);
          gg = c.nesterov ? xsimd::fma(B(c.momentum), buf, gg) : buf;
        }
        pp = xsimd::fnma(B(c.lr), gg, pp);
        pp.store_aligned(p + i);
      }
      break;
  }
  return nonfinite;
}

template <class Arch>
void load_state(const TileCall& call, bool is_v, int64_t off, int64_t len, float* dst) {
  void* base = is_v ? call.v : call.m;
  switch (call.state_type) {
    case StateType::kF32: to_f32<Arch>(static_cast<float*>(base) + off, DType::kF32, len, dst); break;
    case StateType::kBF16: to_f32<Arch>(static_cast<uint16_t*>(base) + off, DType::kBF16, len, dst); break;
    case StateType::kQ8:
      q8_load(static_cast<uint8_t*>(base) + off, (is_v ? call.v_scale : call.m_scale) + off / kQ8BlockElems, is_v,
              len, dst);
      break;
  }
}

template <class Arch>
void store_state(const TileCall& call, bool is_v, int64_t off, int64_t len, const float* src) {
  void* base = is_v ? call.v : call.m;
  switch (call.state_type) {
    case StateType::kF32: from_f32<Arch>(src, DType::kF32, len, static_cast<float*>(base) + off); break;
    case StateType::kBF16: from_f32<Arch>(src, DType::kBF16, len, static_cast<uint16_t*>(base) + off); break;
    case StateType::kQ8:
      q8_store(src, is_v, len, static_cast<uint8_t*>(base) + off, (is_v ? call.v_scale : call.m_scale) + off / kQ8BlockElems);
      break;
  }
}

template <class Arch>
int64_t TileKernel::operator()(Arch, const TileCall& call) const {
  constexpr int64_t W = xsimd::batch<float, Arch>::size;
  alignas(64) float p[kSub], g[kSub], m[kSub], v[kSub];
  const bool has_m = uses_m(call.kind, call.c), has_v = uses_v(call.kind);
  const uint64_t gbytes = dtype_bytes(call.grad_dtype);
  int64_t nonfinite = 0;
  for (int64_t off = 0; off < call.n; off += kSub) {
    const int64_t len = std::min(kSub, call.n - off);
    const int64_t padded = (len + W - 1) / W * W;
    const size_t pad_bytes = static_cast<size_t>(padded - len) * 4;
    std::memcpy(p, call.params + off, static_cast<size_t>(len) * 4);
    to_f32<Arch>(static_cast<const std::byte*>(call.grad) + off * gbytes, call.grad_dtype, len, g);
    std::memset(p + len, 0, pad_bytes);
    std::memset(g + len, 0, pad_bytes);
    if (has_m) {
      load_state<Arch>(call, false, off, len, m);
      std::memset(m + len, 0, pad_bytes);
    }
    if (has_v) {
      load_state<Arch>(call, true, off, len, v);
      std::memset(v + len, 0, pad_bytes);
    }
    nonfinite += update<Arch>(call, p, g, m, v, padded);
    std::memcpy(call.params + off, p, static_cast<size_t>(len) * 4);
    if (has_m) store_state<Arch>(call, false, off, len, m);
    if (has_v) store_state<Arch>(call, true, off, len, v);
    if (call.out != nullptr) {
      from_f32<Arch>(p, call.out_dtype, len, static_cast<std::byte*>(call.out) + off * dtype_bytes(call.out_dtype));
    }
  }
  return nonfinite;
}

template <class Arch>
void StatsKernel::operator()(Arch, const void* grad, DType dtype, int64_t n, float scale, double* partials,
                             int64_t* nonfinite) const {
  using B = xsimd::batch<float, Arch>;
  constexpr int64_t W = B::size;
  alignas(64) float g[kSub];
  int64_t bad = 0;
  for (int64_t off = 0; off < n; off += kSub) {
    const int64_t len = std::min(kSub, n - off);
    const int64_t padded = (len + W - 1) / W * W;
    to_f32<Arch>(static_cast<const std::byte*>(grad) + off * dtype_bytes(dtype), dtype, len, g);
    std::memset(g + len, 0, static_cast<size_t>(padded - len) * 4);
    B acc(0.0f);
    for (int64_t i = 0; i < padded; i += W) {
      B x = B::load_aligned(g + i);
      int64_t k = count_nonfinite<Arch>(x);
      if (k != 0) {
        bad += k;
        x = xsimd::select(xsimd::isfinite(x), x, B(0.0f));
      }
      x = x * B(scale);
      acc = xsimd::fma(x, x, acc);
    }
    // One partial per sub-tile; the caller adds them in order in fp64.
    partials[off / kSub] = static_cast<double>(xsimd::hadd(acc));
  }
  *nonfinite = bad;
}

template <class Arch>
void ConvertKernel::operator()(Arch, const void* src, DType src_type, void* dst, DType dst_type, int64_t n) const {
  alignas(64) float f[kSub];
  for (int64_t off = 0; off < n; off += kSub) {
    const int64_t len = std::min(kSub, n - off);
    to_f32<Arch>(static_cast<const std::byte*>(src) + off * dtype_bytes(src_type), src_type, len, f);
    from_f32<Arch>(f, dst_type, len, static_cast<std::byte*>(dst) + off * dtype_bytes(dst_type));
  }
}

}  // namespace strata::cpu_optim::detail

// Explicit instantiations for one architecture.
#define STRATA_CPU_OPTIM_INSTANTIATE(ARCH)                                                                    \
  template int64_t strata::cpu_optim::detail::TileKernel::operator()<ARCH>(ARCH, const TileCall&) const;      \
  template void strata::cpu_optim::detail::StatsKernel::operator()<ARCH>(ARCH, const void*, DType, int64_t,   \
                                                                          float, double*, int64_t*) const;    \
  template void strata::cpu_optim::detail::ConvertKernel::operator()<ARCH>(ARCH, const void*, DType, void*,   \
                                                                            DType, int64_t) const;
