// Scalar references for every optimizer: plain loops, no intrinsics, one
// element at a time, straight from the formulas.
//
// Adam / AdamW — torch.optim.Adam / AdamW documentation (PyTorch 1.13):
//   g  <- g * grad_scale;  Adam: g <- g + wd * p;  AdamW: p <- p * (1 - lr * wd)
//   m  <- beta1 * m + (1 - beta1) * g
//   v  <- beta2 * v + (1 - beta2) * g^2
//   p  <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Adagrad — torch.optim.Adagrad documentation:
//   clr <- lr / (1 + (t - 1) * lr_decay);  g <- g + wd * p
//   s   <- s + g^2;  p <- p - clr * g / (sqrt(s) + eps)
// Lion — Chen et al. 2023, Algorithm 2:
//   c <- beta1 * m + (1 - beta1) * g;  p <- p * (1 - lr * wd) - lr * sign(c)
//   m <- beta2 * m + (1 - beta2) * g
// SGD — torch.optim.SGD documentation:
//   g <- g + wd * p;  if momentum: b <- (t == 1 ? g : momentum * b + (1 - dampening) * g)
//                                  g <- nesterov ? g + momentum * b : b
//   p <- p - lr * g
// Low-precision states are loaded to fp32, updated, and stored back
// (bf16: round to nearest even; q8: the mini-float format of q8.h).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "cpu_optim/kernel_call.h"
#include "cpu_optim/q8.h"

namespace strata::cpu_optim::detail {
namespace {

float load(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
  }
  return 0;
}

void store(void* base, DType t, int64_t i, float x) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = x; break;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(x); break;
    case DType::kF16: static_cast<uint16_t*>(base)[i] = f32_to_f16(x); break;
  }
}

bool finite(float x) { return std::fabs(x) <= FLT_MAX; }

std::vector<float> load_state(StateType type, const void* q, const float* scales, bool is_v, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (type == StateType::kF32) {
      out[i] = static_cast<const float*>(q)[i];
    } else if (type == StateType::kBF16) {
      out[i] = bf16_to_f32(static_cast<const uint16_t*>(q)[i]);
    } else if (is_v) {
      out[i] = q8_v_decode(static_cast<const uint8_t*>(q)[i], q8_decode_factor(scales[i / kQ8BlockElems], true));
    } else {
      out[i] = q8_m_decode(static_cast<const int8_t*>(q)[i], q8_decode_factor(scales[i / kQ8BlockElems], false));
    }
  }
  return out;
}

void store_state(StateType type, void* q, float* scales, bool is_v, const std::vector<float>& x) {
  int64_t n = static_cast<int64_t>(x.size());
  if (type != StateType::kQ8) {
    for (int64_t i = 0; i < n; ++i) store(q, type == StateType::kF32 ? DType::kF32 : DType::kBF16, i, x[i]);
    return;
  }
  for (int64_t b = 0; b * kQ8BlockElems < n; ++b) {
    int64_t begin = b * kQ8BlockElems, end = std::min(n, begin + kQ8BlockElems);
    float scale = 0;
    for (int64_t i = begin; i < end; ++i) scale = std::max(scale, q8_scale_of(x[i], is_v));
    scale = q8_floored_scale(scale);
    scales[b] = scale;
    const float factor = q8_encode_factor(scale, is_v);
    for (int64_t i = begin; i < end; ++i) {
      if (is_v) {
        static_cast<uint8_t*>(q)[i] = q8_v_encode(x[i], factor);
      } else {
        static_cast<int8_t*>(q)[i] = q8_m_encode(x[i], factor);
      }
    }
  }
}

}  // namespace

void reference_q8_encode(const float* src, int64_t n, bool is_v, void* codes, float* scales) {
  store_state(StateType::kQ8, codes, scales, is_v, std::vector<float>(src, src + n));
}

void reference_q8_decode(const void* codes, const float* scales, int64_t n, bool is_v, float* dst) {
  std::vector<float> x = load_state(StateType::kQ8, codes, scales, is_v, n);
  std::copy(x.begin(), x.end(), dst);
}

int64_t reference_tile(const TileCall& call) {
  const Coeffs& c = call.c;
  const int64_t n = call.n;
  const bool has_m = uses_m(call.kind, c);
  const bool has_v = uses_v(call.kind);
  std::vector<float> m = has_m ? load_state(call.state_type, call.m, call.m_scale, false, n) : std::vector<float>();
  std::vector<float> v = has_v ? load_state(call.state_type, call.v, call.v_scale, true, n) : std::vector<float>();
  int64_t nonfinite = 0;
  for (int64_t i = 0; i < n; ++i) {
    float graw = load(call.grad, call.grad_dtype, i);
    if (!finite(graw)) ++nonfinite;
    float g = graw * call.grad_scale;
    float p = call.params[i];
    switch (call.kind) {
      case OptKind::kAdam: {
        if (!c.decoupled) g = g + c.weight_decay * p;
        m[i] = c.beta1 * m[i] + c.one_minus_beta1 * g;
        // (1 - beta2) * g * g in torch's order (addcmul_'s value * t1 * t2,
        // left to right): finite up to |g| ~ 5.8e20, where g * g first
        // would overflow above 1.8e19 and take no step.
        v[i] = c.beta2 * v[i] + c.one_minus_beta2 * g * g;
        float denom = std::sqrt(v[i]) / c.bias_correction2_sqrt + c.eps;
        if (c.decoupled) p = p * c.decay;
        p = p - c.step_size * (m[i] / denom);
        break;
      }
      case OptKind::kAdagrad:
        g = g + c.weight_decay * p;
        v[i] = v[i] + g * g;
        p = p - c.step_size * (g / (std::sqrt(v[i]) + c.eps));
        break;
      case OptKind::kLion: {
        float u = c.beta1 * m[i] + c.one_minus_beta1 * g;
        float sign = u > 0.0f ? 1.0f : (u < 0.0f ? -1.0f : 0.0f);
        p = p * c.decay - c.lr * sign;
        m[i] = c.beta2 * m[i] + c.one_minus_beta2 * g;
        break;
      }
      case OptKind::kSgd:
        g = g + c.weight_decay * p;
        if (c.momentum != 0.0f) {
          m[i] = c.first_step ? g : c.momentum * m[i] + c.one_minus_dampening * g;
          g = c.nesterov ? g + c.momentum * m[i] : m[i];
        }
        p = p - c.lr * g;
        break;
    }
    call.params_next[i] = p;
    if (call.out != nullptr) store(call.out, call.out_dtype, i, p);
  }
  if (has_m) store_state(call.state_type, call.m_next, call.m_scale_next, false, m);
  if (has_v) store_state(call.state_type, call.v_next, call.v_scale_next, true, v);
  if (call.partials != nullptr) {
    // The statistics the vector kernels fuse into the update: here, as the
    // plain reference, a pass of their own (its count is `nonfinite` again).
    int64_t counted = 0;
    reference_stats(call.grad, call.grad_dtype, call.n, call.grad_scale, call.partials, &counted);
  }
  return nonfinite;
}

void reference_stats(const void* grad, DType dtype, int64_t n, float scale, double* partials, int64_t* nonfinite) {
  int64_t bad = 0;
  for (int64_t begin = 0; begin < n; begin += kGradStatsPartialElems) {
    int64_t end = std::min(n, begin + kGradStatsPartialElems);
    double sum = 0;
    for (int64_t i = begin; i < end; ++i) {
      float g = load(grad, dtype, i);
      if (!finite(g)) {
        ++bad;
        continue;
      }
      double x = static_cast<double>(g * scale);
      sum += x * x;
    }
    partials[begin / kGradStatsPartialElems] = sum;
  }
  *nonfinite = bad;
}

}  // namespace strata::cpu_optim::detail
