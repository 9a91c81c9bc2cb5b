// Every tolerance of the tests' numeric comparisons, each with why it is
// what it is: none is written inline in a test.
//
// cpu_optim: per-dtype tolerances for comparing the vector kernels with the
// scalar reference: |x - ref| <= atol + rtol * |ref| per element. The vector
// code fuses multiply-adds and orders operations differently, so fp32 values
// differ by a few ulps per step; a low-precision output or state can then
// round to the neighbouring value (one ulp of that format).
#pragma once

#include "cpu_optim/dtype.h"

namespace strata::cpu_optim::testing {

struct Tolerance {
  double atol;
  double rtol;
};

inline constexpr Tolerance kF32Params{1e-6, 2e-5};       // fp32 master weights after a few steps
inline constexpr Tolerance kBF16Value{1e-6, 1.0 / 128};  // one bf16 ulp (8 significant bits)
inline constexpr Tolerance kF16Value{1e-6, 1.0 / 1024};  // one fp16 ulp (11 significant bits)
// fp32 optimizer states: Adam's m nearly cancels for small gradients, so the
// few-ulp differences of g (FMA vs separate multiply-add) show as absolute error.
inline constexpr Tolerance kF32State{1e-8, 2e-5};
// bf16 states are compared in units of their own ulp: a rounding that flips at
// one step carries (decayed by beta) into the next, where it can flip again.
inline constexpr int kBF16StateUlps = 2;
// Parameters updated from low-precision (bf16, q8) states: a state that
// rounded the other way (one bf16 ulp, or one q8 quantum of absmax/127) moves
// the step by about 1%, so parameters differ by a small fraction of lr = 1e-3.
inline constexpr Tolerance kLowPrecisionStateParams{2e-5, 2e-5};
// q8: a state one step away (1/8 of itself, more near the bottom of its
// block's range) changes Adam's step m / sqrt(v), bounded by about 2, so an
// element's step can differ by up to ~2 lr. Checked together with "decoded
// states at most a step apart".
inline constexpr Tolerance kQ8Params{2 * 2e-3, 0};

inline Tolerance for_dtype(DType t) {
  switch (t) {
    case DType::kF32: return kF32Params;
    case DType::kBF16: return kBF16Value;
    case DType::kF16: return kF16Value;
  }
  return kF32Params;
}

}  // namespace strata::cpu_optim::testing

namespace strata::testing {

// A value computed in double against the same formula evaluated another
// way in double (a plain loop, a closed form): rounding alone, a few ulps
// of an O(1) result.
inline constexpr double kDoubleRoundoff = 1e-12;
// The host GPT's loss in fp32 against the same model in double: fp32
// rounding accumulated over reductions of a few thousand terms.
inline constexpr double kF32ModelRel = 1e-5;
// A model step that stores weights, activations and gradients in bf16 or
// fp16 against fp32: one 8-bit (bf16) significand's ulps, accumulated over
// a block. Also a CUDA step against the host backend's.
inline constexpr double kLowPrecisionModelRel = 1e-2;
// The planner's bytes of a tier against what the run allocated: the
// formulas leave out allocator rounding and a few small buffers.
inline constexpr double kPlannedBytesRel = 0.05;
// The host tier, counted buffer by buffer: tighter.
inline constexpr double kPlannedHostBytesRel = 0.01;
// The planner's host->device bytes per step against the counted copies
// (the tokens and targets it leaves out are added by the test).
inline constexpr double kPlannedLinkBytesRel = 0.03;

}  // namespace strata::testing
