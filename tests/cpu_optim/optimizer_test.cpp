// Each optimizer x gradient dtype x output dtype x state type, on every
// compiled instruction set, against the scalar reference over several steps,
// per element; awkward sizes and misaligned starts; bitwise equality across
// thread counts and tile sizes; inf/nan handling; argument checks.
#include "cpu_optim/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "cpu_optim/executor.h"
#include "tests/tolerance.h"
#include "tests/test_util.h"

namespace strata::cpu_optim {
namespace {

using testing::Tolerance;

std::unique_ptr<Executor> make_executor(int threads) {
  Result<std::unique_ptr<Executor>> ex = Executor::create({threads, -1});
  EXPECT_TRUE(ex) << ex.error().to_string();
  return std::move(ex).value();
}


// Every buffer of one span, starting `skew` elements into its allocation so
// the kernels see misaligned addresses.
struct Problem {
  int64_t n = 0;
  DType grad_dtype = DType::kF32;
  bool has_out = false;
  DType out_dtype = DType::kBF16;
  StateType state = StateType::kF32;
  int64_t skew = 1;
  std::vector<float> params;
  std::vector<std::byte> grad, out, m, v;
  std::vector<float> m_scale, v_scale;

  Problem(int64_t count, DType g, bool out_on, DType o, StateType s, uint64_t seed)
      : n(count), grad_dtype(g), has_out(out_on), out_dtype(o), state(s) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    params.resize(static_cast<size_t>(n + skew));
    for (float& p : params) p = normal(rng);
    grad.resize(static_cast<size_t>((n + skew) * 4));
    out.resize(static_cast<size_t>((n + skew) * 2));
    uint64_t sb = state_elem_bytes(s);
    m.assign(static_cast<size_t>((n + skew) * sb), std::byte{0});
    v.assign(static_cast<size_t>((n + skew) * sb), std::byte{0});
    size_t blocks = static_cast<size_t>((n + kQ8BlockElems - 1) / kQ8BlockElems) + 1;
    m_scale.assign(blocks, 0.0f);
    v_scale.assign(blocks, 0.0f);
  }

  // Fresh gradients for one step (same seed -> same gradients).
  void fill_grad(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    for (int64_t i = 0; i < n; ++i) set_grad(i, normal(rng) * (i % 97 == 0 ? 20.0f : 1.0f));
  }

  // Gradient element i, stored in the gradient's dtype.
  void set_grad(int64_t i, float g) {
    std::byte* at = grad.data() + (skew + i) * dtype_bytes(grad_dtype);
    if (grad_dtype == DType::kF32) {
      std::memcpy(at, &g, 4);
    } else {
      uint16_t h = grad_dtype == DType::kBF16 ? f32_to_bf16(g) : f32_to_f16(g);
      std::memcpy(at, &h, 2);
    }
  }

  // Element i's m and v, stored as fp32 or bf16 states hold them.
  void set_state(int64_t i, float m_value, float v_value) {
    const uint64_t sb = state_elem_bytes(state);
    const float mv[2] = {m_value, v_value};
    for (int k = 0; k < 2; ++k) {
      std::byte* at = (k == 0 ? m : v).data() + (skew + i) * sb;
      if (state == StateType::kF32) {
        std::memcpy(at, &mv[k], 4);
      } else {
        const uint16_t h = f32_to_bf16(mv[k]);
        std::memcpy(at, &h, 2);
      }
    }
  }

  ParamSpan span() {
    ParamSpan s;
    s.params = params.data() + skew;
    s.n = n;
    s.grad = grad.data() + skew * dtype_bytes(grad_dtype);
    s.grad_dtype = grad_dtype;
    s.weights_out = has_out ? out.data() + skew * 2 : nullptr;
    s.out_dtype = out_dtype;
    uint64_t sb = state_elem_bytes(state);
    s.state.type = state;
    s.state.m = m.data() + skew * sb;
    s.state.v = v.data() + skew * sb;
    // q8 scales stay aligned with the span's blocks; the skew applies to data only.
    s.state.m_scale = m_scale.data();
    s.state.v_scale = v_scale.data();
    return s;
  }
};

float decode(const std::byte* base, DType t, int64_t i) {
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, base + i * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, base + i * 2, 2);
  return t == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// Compares a stream element by element; returns "" or the first mismatches.
template <class Get>
std::string compare(const char* what, int64_t n, Tolerance tol, Get get) {
  std::string out;
  int bad = 0;
  double ref_norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto [x, ref] = get(i);
    ref_norm += static_cast<double>(ref) * ref;
    bool both_nan = std::isnan(x) && std::isnan(ref);
    const bool close = std::fabs(static_cast<double>(x) - ref) <= tol.atol + tol.rtol * std::fabs(ref);
    if (both_nan || x == ref || close) continue;  // x == ref: equal infinities too
    if (bad++ < 3) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "%s[%lld] = %.9g, reference %.9g; ", what, static_cast<long long>(i),
                    static_cast<double>(x), static_cast<double>(ref));
      out += buf;
    }
  }
  if (bad > 3) out += std::to_string(bad) + " mismatches in " + std::to_string(n);
  return out;
}

// params_tol: in place of the state type's tolerance for the parameters.
void expect_close(Problem& got, Problem& ref, const OptimizerConfig& config,
                  std::optional<Tolerance> params_tol = std::nullopt) {
  int64_t n = got.n;
  Tolerance ptol = params_tol                      ? *params_tol
                   : got.state == StateType::kF32  ? testing::kF32Params
                   : got.state == StateType::kBF16 ? testing::kLowPrecisionStateParams
                                                   : testing::kQ8Params;
  EXPECT_EQ(compare("param", n, ptol, [&](int64_t i) { return std::pair(got.params[got.skew + i], ref.params[ref.skew + i]); }), "");
  if (got.has_out) {
    Tolerance otol = testing::for_dtype(got.out_dtype);
    otol.atol = std::max(otol.atol, ptol.atol);
    otol.rtol = std::max(otol.rtol, ptol.rtol);
    EXPECT_EQ(compare("out", n, otol, [&](int64_t i) {
                return std::pair(decode(got.out.data() + got.skew * 2, got.out_dtype, i),
                                 decode(ref.out.data() + ref.skew * 2, ref.out_dtype, i));
              }), "");
  }
  if (got.state == StateType::kQ8) {
    // Quantised states may land one step apart where a rounding went the
    // other way: decoded, within an eighth of their size or the smallest
    // step of the larger scale.
    for (Q8Array which : {Q8Array::kM, Q8Array::kV}) {
      const bool is_v = which == Q8Array::kV;
      const std::vector<float>& gs = is_v ? got.v_scale : got.m_scale;
      const std::vector<float>& rs = is_v ? ref.v_scale : ref.m_scale;
      std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      ASSERT_TRUE(q8_decode((is_v ? got.v : got.m).data() + got.skew, gs.data(), n, which, a.data(), Isa::kScalar).ok());
      ASSERT_TRUE(q8_decode((is_v ? ref.v : ref.m).data() + ref.skew, rs.data(), n, which, b.data(), Isa::kScalar).ok());
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double scale = std::max(gs[static_cast<size_t>(i / kQ8BlockElems)], rs[static_cast<size_t>(i / kQ8BlockElems)]);
        const double tol = (std::fabs(a[i]) + std::fabs(b[i])) / 8 + scale * (is_v ? 0x1p-31 : 0x1p-7);
        bad += std::fabs(static_cast<double>(a[i]) - b[i]) <= tol ? 0 : 1;
      }
      EXPECT_EQ(bad, 0) << (is_v ? "v" : "m") << " states more than a step apart";
    }
    return;
  }
  DType sdt = got.state == StateType::kF32 ? DType::kF32 : DType::kBF16;
  // bf16 states: within kBF16StateUlps ulps. Where m nearly cancels
  // (beta1 * m against (1 - beta1) * g) the error is an ulp of the terms, not of
  // the small result, so the absolute part scales with the largest state.
  auto state_tol = [&](const std::vector<std::byte>& ref_state) {
    if (got.state == StateType::kF32) return testing::kF32State;
    double top = 0;
    for (int64_t i = 0; i < n; ++i) top = std::max(top, std::fabs(static_cast<double>(decode(ref_state.data() + ref.skew * 2, sdt, i))));
    double ulps = testing::kBF16StateUlps / 128.0;
    return Tolerance{ulps * top, ulps};
  };
  int states = state_count(config);
  if (states >= 1 && !std::holds_alternative<AdagradConfig>(config)) {
    uint64_t sb = state_elem_bytes(got.state);
    EXPECT_EQ(compare("m", n, state_tol(ref.m), [&](int64_t i) {
                return std::pair(decode(got.m.data() + got.skew * sb, sdt, i), decode(ref.m.data() + ref.skew * sb, sdt, i));
              }), "");
  }
  if (std::holds_alternative<AdamConfig>(config) || std::holds_alternative<AdagradConfig>(config)) {
    uint64_t sb = state_elem_bytes(got.state);
    EXPECT_EQ(compare("v", n, state_tol(ref.v), [&](int64_t i) {
                return std::pair(decode(got.v.data() + got.skew * sb, sdt, i), decode(ref.v.data() + ref.skew * sb, sdt, i));
              }), "");
  }
}

std::vector<std::pair<std::string, OptimizerConfig>> configs() {
  AdamConfig adam;
  adam.decoupled_weight_decay = false;
  adam.weight_decay = 0.01f;
  AdamConfig adamw;
  adamw.weight_decay = 0.1f;
  AdagradConfig adagrad;
  adagrad.lr_decay = 0.01f;
  adagrad.weight_decay = 0.01f;
  LionConfig lion;
  lion.weight_decay = 0.1f;
  SgdConfig sgd;
  SgdConfig momentum;
  momentum.momentum = 0.9f;
  momentum.dampening = 0.1f;
  momentum.weight_decay = 0.01f;
  SgdConfig nesterov;
  nesterov.momentum = 0.9f;
  nesterov.nesterov = true;
  return {{"adam_l2", adam},      {"adamw", adamw},       {"adagrad", adagrad},   {"lion", lion},
          {"sgd", sgd},           {"sgd_momentum", momentum}, {"sgd_nesterov", nesterov}};
}

constexpr int kSteps = 4;

void run_steps(const OptimizerConfig& config, Problem& p, Isa isa, Executor& ex, uint64_t seed, float grad_scale) {
  for (int t = 1; t <= kSteps; ++t) {
    p.fill_grad(seed * 100 + t);
    StepOptions options;
    options.isa = isa;
    options.grad_scale = grad_scale;
    Result<StepReport> r = step(config, t, p.span(), options, ex);
    ASSERT_TRUE(r) << r.error().to_string();
    ASSERT_EQ(r->nonfinite, 0);
  }
}

const std::vector<int64_t> kSizes = {0, 1, 7, 15, 16, 17, 33, 255, 257, 1023, 1025, 4099, 70001};

TEST(Optimizer, EveryIsaMatchesReferenceForEveryOptimizerAndDtype) {
  uint64_t seed = strata::testing::test_seed(51);
  auto ex = make_executor(2);
  std::vector<Isa> isas = available_isas();
  std::printf("instruction sets: ");
  for (Isa i : isas) std::printf("%s ", std::string(isa_name(i)).c_str());
  std::printf("\n");
  for (const auto& [name, config] : configs()) {
    for (DType g : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int out = 0; out < 3; ++out) {
        for (int64_t n : kSizes) {
          DType odt = out == 2 ? DType::kF16 : DType::kBF16;
          Problem ref(n, g, out != 0, odt, StateType::kF32, seed + n);
          std::vector<float> initial = ref.params;
          run_steps(config, ref, Isa::kScalar, *ex, seed, 0.5f);
          if (n > 0) {
            ASSERT_NE(ref.params, initial) << name << ": the reference did not move";  // non-trivial
          }
          for (Isa isa : isas) {
            if (isa == Isa::kScalar) continue;
            SCOPED_TRACE(name + " grad " + std::string(dtype_name(g)) + " out " +
                         (out == 0 ? "none" : std::string(dtype_name(odt))) + " n " + std::to_string(n) + " isa " +
                         std::string(isa_name(isa)));
            Problem got(n, g, out != 0, odt, StateType::kF32, seed + n);
            run_steps(config, got, isa, *ex, seed, 0.5f);
            expect_close(got, ref, config);
            if (::testing::Test::HasFailure()) return;
          }
        }
      }
    }
  }
}

// Second moments where a root's estimate needs care: +-0, subnormal, the
// smallest and largest normal numbers, +inf.
constexpr std::array<float, 8> kSecondMomentSpecials = {0.0f, -0.0f, 1e-40f, FLT_MIN, 1.0f, 1e30f, FLT_MAX, INFINITY};

// Low-precision states take the coarse estimates (~1e-4 relative on
// AVX-512, ~1e-3 on AVX2), and a zero v makes the step large (lr * m /
// eps): each parameter's step within 2e-3 of the reference's, and finite.
void expect_coarse_steps_close(const Problem& got, const Problem& ref, const std::vector<float>& initial) {
  for (int64_t i = 0; i < got.n; ++i) {
    const double p0 = initial[ref.skew + i];
    const double want = ref.params[ref.skew + i], have = got.params[got.skew + i];
    ASSERT_TRUE(std::isfinite(have)) << i;
    EXPECT_LE(std::fabs(have - want), 2e-3 * std::fabs(want - p0) + 1e-6 * std::fabs(want)) << i;
  }
}

// Steps p once (t = 3) with `isa`: the step must succeed and find its
// gradients finite.
void step_once(const OptimizerConfig& config, Isa isa, Problem& p, Executor& ex) {
  StepOptions options;
  options.isa = isa;
  Result<StepReport> r = step(config, 3, p.span(), options, ex);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r->nonfinite, 0);
}

// Second moments at the edges of sqrt's domain — +0, -0, subnormal, the
// smallest and largest normal numbers, +inf — through the roots of Adam
// and Adagrad over fp32 states (fast_sqrt and fast_reciprocal: AVX-512
// fixes them up with vfixupimmps, AVX2 with selects and a clamp) and of
// Adam over bf16 states (coarse_step_factor) give the reference's weights
// and states on every instruction set: +-0 a step of lr * m / eps, +inf
// no step.
TEST(Optimizer, SecondMomentsAtTheEdgesOfTheRootMatchReference) {
  auto ex = make_executor(2);
  for (StateType state : {StateType::kF32, StateType::kBF16}) {
    for (const auto& [name, config] : configs()) {
      const bool adam = std::holds_alternative<AdamConfig>(config);
      if (!adam && !(std::holds_alternative<AdagradConfig>(config) && state == StateType::kF32)) continue;
      for (int64_t n : {int64_t{7}, int64_t{67}}) {
        auto prepare = [&](Problem& p) {
          for (int64_t i = 0; i < n; ++i) {
            p.set_grad(i, 0.0f);
            p.set_state(i, i % 2 == 0 ? 0.1f : -0.1f, kSecondMomentSpecials[i % kSecondMomentSpecials.size()]);
          }
        };
        Problem start(n, DType::kF32, true, DType::kBF16, state, 7);
        prepare(start);
        Problem ref = start;
        ASSERT_NO_FATAL_FAILURE(step_once(config, Isa::kScalar, ref, *ex));
        for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(ref.params[ref.skew + i])) << name << " " << i;
        for (Isa isa : available_isas()) {
          if (isa == Isa::kScalar) continue;
          SCOPED_TRACE(name + (state == StateType::kF32 ? " fp32" : " bf16") + " states, n " + std::to_string(n) +
                       " isa " + std::string(isa_name(isa)));
          Problem got = start;
          ASSERT_NO_FATAL_FAILURE(step_once(config, isa, got, *ex));
          if (state == StateType::kF32) {
            expect_close(got, ref, config);
            continue;
          }
          expect_coarse_steps_close(got, ref, start.params);
        }
      }
    }
  }
}

// The AVX-512 BF16 rounding instruction (Isa::kAvx512Bf16) gives exactly
// the integer path's bits (Isa::kAvx512) for every bf16 the kernels write —
// new weights, streamed or not, and bf16 Adam states — subnormals included,
// which the instruction alone flushes to zero; and a pure rounding (SGD with
// lr 0) equals f32_to_bf16 of each parameter.
TEST(Optimizer, Avx512Bf16RoundsExactlyAsTheIntegerPath) {
  const std::vector<Isa> isas = available_isas();
  if (std::find(isas.begin(), isas.end(), Isa::kAvx512Bf16) == isas.end()) {
    GTEST_SKIP() << "this CPU has no AVX-512 BF16 (or AVX-512)";
  }
  uint64_t seed = strata::testing::test_seed(57);
  auto ex = make_executor(2);
  const int64_t n = 4099;
  // Finite values over the whole exponent range, a quarter of them subnormal,
  // and rounding ties.
  std::mt19937_64 rng(seed);
  std::vector<float> base(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b = static_cast<uint32_t>(rng());
    if (i % 4 == 0) b &= 0x807FFFFFu;                       // subnormal (or zero)
    if ((b & 0x7F800000u) == 0x7F800000u) b &= 0xBFFFFFFFu;  // no inf / NaN
    if (i % 7 == 0) b = (b & 0xFFFF0000u) | 0x8000u;        // a tie
    base[static_cast<size_t>(i)] = std::bit_cast<float>(b);
  }
  struct Run {
    std::vector<float> params;
    std::vector<uint16_t> out, m, v;
  };
  // `shift`: the outputs one element into their buffer (not streamed).
  auto run = [&](Isa isa, const OptimizerConfig& config, StateType st, int shift) {
    Run r;
    r.params = base;
    r.out.assign(static_cast<size_t>(n + 64), 0);
    r.m.assign(static_cast<size_t>(n), 0);
    r.v.assign(static_cast<size_t>(n), 0);
    std::vector<float> m32(static_cast<size_t>(n), 0.0f), v32(static_cast<size_t>(n), 0.0f);
    std::vector<uint16_t> grad(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) grad[static_cast<size_t>(i)] = f32_to_bf16(base[static_cast<size_t>((i * 31) % n)]);
    ParamSpan span;
    span.params = r.params.data();
    span.n = n;
    span.grad = grad.data();
    span.grad_dtype = DType::kBF16;
    span.weights_out = r.out.data() + 32 + shift;
    span.out_dtype = DType::kBF16;
    span.state.type = st;
    span.state.m = st == StateType::kBF16 ? static_cast<void*>(r.m.data()) : m32.data();
    span.state.v = st == StateType::kBF16 ? static_cast<void*>(r.v.data()) : v32.data();
    StepOptions options;
    options.isa = isa;
    for (int t = 1; t <= 3; ++t) {
      Result<StepReport> rep = step(config, t, span, options, *ex);
      EXPECT_TRUE(rep) << rep.error().to_string();
    }
    return r;
  };
  AdamConfig adam;
  adam.lr = 1e-3f;
  SgdConfig round_only;
  round_only.lr = 0.0f;
  for (int shift : {0, 1}) {
    for (StateType st : {StateType::kF32, StateType::kBF16}) {
      SCOPED_TRACE(std::string(state_type_name(st)) + " states, out shifted " + std::to_string(shift));
      const Run a = run(Isa::kAvx512, adam, st, shift), b = run(Isa::kAvx512Bf16, adam, st, shift);
      EXPECT_EQ(std::memcmp(a.params.data(), b.params.data(), a.params.size() * 4), 0);
      EXPECT_EQ(a.out, b.out);
      EXPECT_EQ(a.m, b.m);
      EXPECT_EQ(a.v, b.v);
    }
    const Run r = run(Isa::kAvx512Bf16, round_only, StateType::kF32, shift);
    int subnormal = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float p = base[static_cast<size_t>(i)];
      subnormal += std::fpclassify(p) == FP_SUBNORMAL ? 1 : 0;
      ASSERT_EQ(r.out[static_cast<size_t>(32 + shift + i)], f32_to_bf16(p)) << "element " << i << " bits " << std::hex
                                                                            << std::bit_cast<uint32_t>(p);
    }
    EXPECT_GT(subnormal, n / 5);
  }
}

TEST(Optimizer, LowPrecisionStatesMatchReference) {
  uint64_t seed = strata::testing::test_seed(52);
  auto ex = make_executor(2);
  for (StateType st : {StateType::kBF16, StateType::kQ8}) {
    for (bool decoupled : {true, false}) {
      AdamConfig adam;
      adam.decoupled_weight_decay = decoupled;
      adam.weight_decay = 0.05f;
      for (DType g : {DType::kF32, DType::kBF16, DType::kF16}) {
        // A gradient scale other than 1 too: the 8-bit AdamW kernel holds
        // the moments divided by (1 - beta1) scale and (1 - beta2) scale^2
        // instead of multiplying the gradient; 1e-4 is a loss scale's, and
        // at 0 those divisors are zero, where the staged path takes the tile.
        for (float gs : {1.0f, 0.3f, 1e-4f, 0.0f}) {
          for (int64_t n : kSizes) {
            Problem ref(n, g, true, DType::kBF16, st, seed + n);
            run_steps(adam, ref, Isa::kScalar, *ex, seed, gs);
            for (Isa isa : available_isas()) {
              if (isa == Isa::kScalar) continue;
              SCOPED_TRACE(std::string(state_type_name(st)) + " states, grad " + std::string(dtype_name(g)) +
                           " scale " + std::to_string(gs) + " n " + std::to_string(n) + " isa " +
                           std::string(isa_name(isa)));
              Problem got(n, g, true, DType::kBF16, st, seed + n);
              run_steps(adam, got, isa, *ex, seed, gs);
              expect_close(got, ref, adam);
              if (::testing::Test::HasFailure()) return;
            }
          }
        }
      }
    }
  }
}

// How much low-precision states cost in accuracy, on a noisy quadratic:
// minimise sum_i a_i (p_i - c_i)^2 / 2 with AdamW for 300 steps, and compare
// the final loss and the parameters with the fp32-state run. The numbers are
// printed (docs/CPU_OPTIM.md quotes them) and bounded.
TEST(Optimizer, LowPrecisionStateAccuracyAgainstFp32States) {
  uint64_t seed = strata::testing::test_seed(55);
  const int64_t n = 1 << 16;
  auto ex = make_executor(2);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(0.1f, 10.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(n), c(n), init(n);
  for (int64_t i = 0; i < n; ++i) a[i] = uni(rng), c[i] = normal(rng), init[i] = normal(rng);
  auto run = [&](StateType st, double* loss) {
    Problem p(n, DType::kF32, true, DType::kBF16, st, 0);
    std::copy(init.begin(), init.end(), p.params.begin() + p.skew);
    std::mt19937_64 noise(seed + 1);
    std::vector<float> g(n);
    AdamConfig adamw;
    adamw.lr = 1e-2f;
    adamw.weight_decay = 0.01f;
    for (int t = 1; t <= 300; ++t) {
      for (int64_t i = 0; i < n; ++i) g[i] = a[i] * (p.params[p.skew + i] - c[i]) + 0.1f * normal(noise);
      std::memcpy(p.grad.data() + p.skew * 4, g.data(), n * 4);
      EXPECT_TRUE(step(adamw, t, p.span(), StepOptions{}, *ex));
    }
    double l = 0;
    for (int64_t i = 0; i < n; ++i) l += 0.5 * a[i] * std::pow(p.params[p.skew + i] - c[i], 2);
    *loss = l / n;
    return std::vector<float>(p.params.begin() + p.skew, p.params.end());
  };
  double loss0 = 0, loss_init = 0;
  for (int64_t i = 0; i < n; ++i) loss_init += 0.5 * a[i] * std::pow(init[i] - c[i], 2) / n;
  std::vector<float> ref = run(StateType::kF32, &loss0);
  std::printf("fp32 states: mean loss %.5f -> %.5f\n", loss_init, loss0);
  ASSERT_LT(loss0, 0.05 * loss_init);
  for (StateType st : {StateType::kBF16, StateType::kQ8}) {
    double loss = 0;
    std::vector<float> got = run(st, &loss);
    double dev = 0, moved = 0;
    for (int64_t i = 0; i < n; ++i) {
      dev += std::pow(got[i] - ref[i], 2);
      moved += std::pow(ref[i] - init[i], 2);
    }
    double rel = std::sqrt(dev / moved);
    std::printf("%s states: mean loss %.5f (fp32 states %.5f), params rms deviation %.2e of the distance travelled\n",
                std::string(state_type_name(st)).c_str(), loss, loss0, rel);
    EXPECT_LT(loss, 1.5 * loss0 + 1e-4) << state_type_name(st);
    EXPECT_LT(rel, st == StateType::kBF16 ? 0.02 : 0.05) << state_type_name(st);
  }
}

// A q8 block whose largest m is subnormal: its encoding factor (the top
// code over the scale) must stay finite, or every element of the block,
// zeros too, lands on the top code and decodes as the largest value. Each
// block below holds one tiny gradient and zeros; after a step the zeros'
// m decodes as 0 and the tiny one as its (1 - beta1) g, on every ISA, with
// both the fused AdamW loop (decoupled) and the staged one (coupled), and
// gradient scales that move the scaled moments' blocks into and out of the
// subnormal range.
TEST(Optimizer, Q8BlocksWhoseLargestValueIsSubnormalKeepTheirZeros) {
  auto ex = make_executor(1);
  const float tiny[] = {5e-39f, -3e-41f, std::numeric_limits<float>::denorm_min() * 64, 1.1e-38f};
  const auto blocks = static_cast<int64_t>(std::size(tiny));
  const int64_t n = blocks * kQ8BlockElems;
  for (bool decoupled : {true, false}) {
    for (float gs : {1.0f, 0.3f, 8.0f, 100.0f}) {
      for (Isa isa : available_isas()) {
        SCOPED_TRACE(std::string(decoupled ? "adamw" : "adam") + " scale " + std::to_string(gs) + " " +
                     std::string(isa_name(isa)));
        AdamConfig adam;
        adam.decoupled_weight_decay = decoupled;
        Problem p(n, DType::kF32, false, DType::kBF16, StateType::kQ8, 7);
        for (int64_t i = 0; i < n; ++i) p.set_grad(i, 0.0f);
        for (int64_t b = 0; b < blocks; ++b) p.set_grad(b * kQ8BlockElems + 5 * b + 3, tiny[b]);
        StepOptions o;
        o.isa = isa;
        o.grad_scale = gs;
        Result<StepReport> r = step(adam, 1, p.span(), o, *ex);
        ASSERT_TRUE(r) << r.error().to_string();
        std::vector<float> m(static_cast<size_t>(n));
        ASSERT_TRUE(q8_decode(p.m.data() + p.skew, p.m_scale.data(), n, Q8Array::kM, m.data(), Isa::kScalar).ok());
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t at = b * kQ8BlockElems + 5 * b + 3;
          const double want = (1.0 - adam.beta1) * static_cast<double>(tiny[b]) * gs;
          for (int64_t i = b * kQ8BlockElems; i < (b + 1) * kQ8BlockElems; ++i) {
            if (i == at) {
              // Within half a step (1/32 relative), or half a linear step of
              // the (floored) scale, or two of fp32's subnormal steps.
              const double scale = p.m_scale[static_cast<size_t>(b)];
              EXPECT_NEAR(
                  m[i], want,
                  std::fabs(want) / 32 + scale * 0x1p-12 / 1.9296875 + 2 * std::numeric_limits<float>::denorm_min())
                  << "block " << b << " (scale " << scale << ")";
            } else {
              ASSERT_EQ(m[i], 0.0f) << "block " << b << " element " << i - b * kQ8BlockElems << " (scale "
                                    << p.m_scale[static_cast<size_t>(b)] << ")";
            }
          }
        }
      }
    }
  }
}

TEST(Optimizer, BitIdenticalAcrossThreadCountsAndTileSizes) {
  uint64_t seed = strata::testing::test_seed(53);
  const int64_t n = (1 << 18) + 5;
  AdamConfig adamw;
  adamw.weight_decay = 0.1f;
  for (StateType st : {StateType::kF32, StateType::kQ8}) {
    Problem base(n, DType::kBF16, true, DType::kBF16, st, seed);
    auto ex1 = make_executor(1);
    StepOptions o;
    o.tile_elems = 4096;
    base.fill_grad(seed);
    ASSERT_TRUE(step(adamw, 1, base.span(), o, *ex1));
    for (int threads : {1, 2}) {
      // The largest tile is the span itself (it wrapped to 0 when rounded up).
      for (int64_t tile :
           {int64_t{4096}, int64_t{65536}, int64_t{1} << 20, int64_t{5000}, std::numeric_limits<int64_t>::max()}) {
        SCOPED_TRACE("threads " + std::to_string(threads) + " tile " + std::to_string(tile));
        Problem p(n, DType::kBF16, true, DType::kBF16, st, seed);
        p.fill_grad(seed);
        auto ex = make_executor(threads);
        StepOptions po;
        po.tile_elems = tile;
        ASSERT_TRUE(step(adamw, 1, p.span(), po, *ex));
        EXPECT_EQ(std::memcmp(p.params.data(), base.params.data(), p.params.size() * 4), 0);
        EXPECT_EQ(p.m, base.m);
        EXPECT_EQ(p.v, base.v);
        EXPECT_EQ(p.out, base.out);
        EXPECT_EQ(p.m_scale, base.m_scale);
      }
    }
  }
}

// An update out of place (params_next / state_next) writes what the update
// in place writes, bit for bit, and leaves its inputs as they were: for every
// ISA, optimizer and state type, with a misaligned span that ends in a tail.
TEST(Optimizer, OutOfPlaceUpdateGivesTheInPlaceBitsAndKeepsItsInputs) {
  uint64_t seed = strata::testing::test_seed(59);
  auto ex = make_executor(2);
  const int64_t n = 70001;
  std::vector<std::pair<std::string, OptimizerConfig>> cases = configs();
  for (const auto& [name, config] : cases) {
    const bool adam = std::holds_alternative<AdamConfig>(config);
    for (StateType st : {StateType::kF32, StateType::kBF16, StateType::kQ8}) {
      if (!adam && st != StateType::kF32) continue;
      for (Isa isa : available_isas()) {
        SCOPED_TRACE(name + " " + std::string(state_type_name(st)) + " " + std::string(isa_name(isa)));
        // Two steps in place make a state worth keeping; then the third step
        // in place on one copy and out of place from another.
        Problem in_place(n, DType::kBF16, true, DType::kBF16, st, seed);
        StepOptions o;
        o.isa = isa;
        for (int t = 1; t <= 2; ++t) {
          in_place.fill_grad(seed + t);
          ASSERT_TRUE(step(config, t, in_place.span(), o, *ex));
        }
        Problem from = in_place;
        Problem to = in_place;
        for (float& x : to.params) x = -7.0f;  // every element must be written
        std::fill(to.m.begin(), to.m.end(), std::byte{0x55});
        std::fill(to.v.begin(), to.v.end(), std::byte{0x55});
        std::fill(to.out.begin(), to.out.end(), std::byte{0x55});
        in_place.fill_grad(seed + 3);
        from.fill_grad(seed + 3);
        ASSERT_TRUE(step(config, 3, in_place.span(), o, *ex));
        const Problem kept = from;
        ParamSpan span = from.span();
        ParamSpan next = to.span();
        span.params_next = next.params;
        span.state_next = next.state;
        span.weights_out = to.out.data() + to.skew * 2;
        Result<StepReport> r = step(config, 3, span, o, *ex);
        ASSERT_TRUE(r) << r.error().to_string();
        EXPECT_EQ(std::memcmp(to.params.data() + 1, in_place.params.data() + 1, static_cast<size_t>(n) * 4), 0);
        EXPECT_EQ(std::memcmp(to.out.data() + 2, in_place.out.data() + 2, static_cast<size_t>(n) * 2), 0);
        const size_t sb = state_elem_bytes(st);
        const int states = state_count(config);
        if (states >= 1 && !std::holds_alternative<AdagradConfig>(config)) {
          EXPECT_EQ(std::memcmp(to.m.data() + sb, in_place.m.data() + sb, static_cast<size_t>(n) * sb), 0);
        }
        if (adam || std::holds_alternative<AdagradConfig>(config)) {
          EXPECT_EQ(std::memcmp(to.v.data() + sb, in_place.v.data() + sb, static_cast<size_t>(n) * sb), 0);
        }
        if (st == StateType::kQ8) {
          EXPECT_EQ(to.m_scale, in_place.m_scale);
          EXPECT_EQ(to.v_scale, in_place.v_scale);
        }
        EXPECT_EQ(std::memcmp(from.params.data(), kept.params.data(), from.params.size() * 4), 0);
        EXPECT_EQ(from.m, kept.m);
        EXPECT_EQ(from.v, kept.v);
        EXPECT_EQ(from.m_scale, kept.m_scale);
        EXPECT_EQ(from.v_scale, kept.v_scale);
      }
    }
  }
  // Half given is an error that names what is missing.
  Problem p(16, DType::kF32, false, DType::kBF16, StateType::kF32, seed);
  ParamSpan half = p.span();
  half.state_next.m = p.m.data();
  Result<StepReport> bad = step(AdamConfig{}, 1, half, {}, *ex);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("params_next"), std::string::npos);
  ParamSpan no_v = p.span();
  no_v.params_next = p.params.data();
  no_v.state_next.m = p.m.data();
  bad = step(AdamConfig{}, 1, no_v, {}, *ex);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("state_next"), std::string::npos);
}

// The low-precision weights are streamed past the caches when their buffer
// is aligned to a vector (non-temporal stores), stored normally otherwise:
// the same bits either way, for every ISA, output type and state type.
TEST(Optimizer, AlignedWeightsOutGivesTheSameBitsAsUnaligned) {
  uint64_t seed = strata::testing::test_seed(61);
  auto ex = make_executor(2);
  const int64_t n = 70001;
  AdamConfig adamw;
  adamw.weight_decay = 0.1f;
  for (DType odt : {DType::kBF16, DType::kF16}) {
    for (StateType st : {StateType::kF32, StateType::kBF16, StateType::kQ8}) {
      for (Isa isa : available_isas()) {
        SCOPED_TRACE(std::string(dtype_name(odt)) + " out, " + std::string(state_type_name(st)) + " states, " +
                     std::string(isa_name(isa)));
        Problem a(n, DType::kBF16, true, odt, st, seed), b = a;
        // One out buffer at a 64-byte boundary, the other two bytes past one.
        std::vector<std::byte> out_a(static_cast<size_t>(n) * 2 + 128), out_b(out_a.size());
        auto at = [](std::vector<std::byte>& v, uintptr_t offset) {
          auto base = reinterpret_cast<uintptr_t>(v.data());
          return v.data() + ((64 - base % 64) % 64 + offset);
        };
        std::byte* wa = at(out_a, 0);
        std::byte* wb = at(out_b, 2);
        StepOptions o;
        o.isa = isa;
        for (int t = 1; t <= 3; ++t) {
          a.fill_grad(seed + t);
          b.fill_grad(seed + t);
          ParamSpan sa = a.span(), sb = b.span();
          sa.weights_out = wa;
          sb.weights_out = wb;
          ASSERT_TRUE(step(adamw, t, sa, o, *ex));
          ASSERT_TRUE(step(adamw, t, sb, o, *ex));
          ASSERT_EQ(std::memcmp(wa, wb, static_cast<size_t>(n) * 2), 0) << "step " << t;
        }
        EXPECT_EQ(a.params, b.params);
        EXPECT_EQ(a.m, b.m);
        EXPECT_EQ(a.v, b.v);
        // And the weights are the parameters rounded.
        for (int64_t i = 0; i < n; i += 997) {
          uint16_t h;
          std::memcpy(&h, wa + i * 2, 2);
          const float p = a.params[static_cast<size_t>(a.skew + i)];
          ASSERT_EQ(h, odt == DType::kBF16 ? f32_to_bf16(p) : f32_to_f16(p)) << "element " << i;
        }
      }
    }
  }
}

TEST(Optimizer, NonFiniteGradientsAreReportedAndSkipUpdatesNothing) {
  auto ex = make_executor(2);
  AdamConfig adam;
  adam.weight_decay = 0.01f;
  int checked = 0;
  for (DType g : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (StateType st : {StateType::kF32, StateType::kBF16, StateType::kQ8}) {
      for (Isa isa : available_isas()) {
        // Weights out two bytes past the span (as Problem places them) and
        // at a 64-byte boundary, where the AVX-512 loops stream pairs of
        // batches and take the check from their class test.
        for (bool aligned_out : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(g)) + " grad, " + std::string(state_type_name(st)) + " states, " +
                       std::string(isa_name(isa)) + (aligned_out ? ", aligned out" : ""));
          Problem p(5000, g, true, DType::kBF16, st, 7);
          std::vector<std::byte> out_buf(static_cast<size_t>(p.n) * 2 + 64);
          const auto base = reinterpret_cast<uintptr_t>(out_buf.data());
          std::byte* out_at = out_buf.data() + (64 - base % 64) % 64;
          auto span = [&] {
            ParamSpan s = p.span();
            if (aligned_out) s.weights_out = out_at;
            return s;
          };
          StepOptions o;
          o.isa = isa;
          // A first clean step, so that the states (and q8 scales) are not zero.
          p.fill_grad(7);
          ASSERT_TRUE(step(adam, 1, span(), o, *ex));
          // The second batch of a pair (element 337: block 1, batch 5) and
          // the first of one (777); then the scalar tail (4999) alone, so
          // that neither hides a miss of the other (a tile that saw one
          // counts all of its elements again).
          for (int round = 0; round < 2; ++round) {
            p.fill_grad(8);
            if (round == 0) {
              p.set_grad(337, std::numeric_limits<float>::infinity());
              p.set_grad(777, std::numeric_limits<float>::quiet_NaN());
            } else {
              p.set_grad(4999, -std::numeric_limits<float>::infinity());
            }
            const int64_t bad = round == 0 ? 2 : 1;
            const std::vector<float> before = p.params;
            const std::vector<std::byte> m_before = p.m, out_before = p.out, aligned_before = out_buf;
            Result<StepReport> r = step(adam, 2, span(), o, *ex);
            ASSERT_TRUE(r);
            EXPECT_TRUE(r->skipped);
            EXPECT_EQ(r->nonfinite, bad);
            EXPECT_EQ(p.params, before);
            EXPECT_EQ(p.m, m_before);
            EXPECT_EQ(p.out, out_before);
            EXPECT_EQ(out_buf, aligned_before);
            StepOptions report_only = o;
            report_only.nonfinite = NonFinitePolicy::kReportOnly;
            Problem kept = p;
            r = step(adam, 2, span(), report_only, *ex);
            ASSERT_TRUE(r);
            EXPECT_FALSE(r->skipped);
            EXPECT_EQ(r->nonfinite, bad);
            EXPECT_NE(p.params[p.skew], before[p.skew]);
            for (int64_t i : round == 0 ? std::vector<int64_t>{337, 777} : std::vector<int64_t>{4999}) {
              EXPECT_TRUE(std::isnan(p.params[static_cast<size_t>(p.skew + i)])) << "element " << i;
            }
            p = kept;  // back to the states before the poisoned step
          }

          // Finite gradients beside weights that are infinite or subnormal:
          // nothing to report, and the weights out are the new weights
          // rounded (subnormals included).
          Problem q(5000, g, true, DType::kBF16, st, 9);
          q.fill_grad(9);
          q.params[static_cast<size_t>(q.skew + 340)] = std::numeric_limits<float>::infinity();
          for (int64_t i = 800; i < 832; ++i) {  // a zero first step keeps them subnormal (times the decay)
            q.params[static_cast<size_t>(q.skew + i)] = 1e-39f;
            q.set_grad(i, 0.0f);
          }
          ParamSpan qs = q.span();
          if (aligned_out) qs.weights_out = out_at;
          StepOptions report_only = o;
          report_only.nonfinite = NonFinitePolicy::kReportOnly;
          Result<StepReport> r = step(adam, 1, qs, report_only, *ex);
          ASSERT_TRUE(r);
          EXPECT_EQ(r->nonfinite, 0);
          EXPECT_FALSE(r->skipped);
          EXPECT_EQ(std::fpclassify(q.params[static_cast<size_t>(q.skew + 800)]), FP_SUBNORMAL);
          for (int64_t i : {int64_t{340}, int64_t{800}, int64_t{831}, int64_t{1000}}) {
            uint16_t h;
            std::memcpy(&h, static_cast<const std::byte*>(qs.weights_out) + i * 2, 2);
            EXPECT_EQ(h, f32_to_bf16(q.params[static_cast<size_t>(q.skew + i)])) << "element " << i;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GE(checked, 18);
}

TEST(GradStats, MatchesFp64AndIsDeterministic) {
  uint64_t seed = strata::testing::test_seed(54);
  const int64_t n = 300007;
  Problem p(n, DType::kBF16, false, DType::kBF16, StateType::kF32, seed);
  p.fill_grad(seed);
  double want = 0;
  for (int64_t i = 0; i < n; ++i) {
    double x = static_cast<double>(decode(p.grad.data() + p.skew * 2, DType::kBF16, i)) * 0.25;
    want += x * x;
  }
  ASSERT_GT(want, 0.0);
  auto ex1 = make_executor(1), ex2 = make_executor(2);
  for (Isa isa : available_isas()) {
    Result<GradStats> a = grad_stats(p.span().grad, DType::kBF16, n, 0.25f, *ex1, isa);
    Result<GradStats> b = grad_stats(p.span().grad, DType::kBF16, n, 0.25f, *ex2, isa);
    ASSERT_TRUE(a && b);
    EXPECT_NEAR(a->sum_squares, want, want * 1e-5) << isa_name(isa);
    EXPECT_EQ(a->sum_squares, b->sum_squares) << isa_name(isa);  // bitwise, any thread count
    EXPECT_EQ(a->nonfinite, 0);
  }
}

// StepOptions::stats: the update's own read of the gradient gives what
// grad_stats gives, bit for bit — every ISA, optimizer, state type,
// gradient dtype, awkward lengths (partials cut short, spans ending inside a
// vector or a q8 block), tile sizes and thread counts, with and without
// non-finite elements; spans stepped in turn add up to the whole; and the
// update itself writes the same bits as without the statistics.
TEST(Optimizer, StepStatisticsAreGradStatsBitForBit) {
  uint64_t seed = strata::testing::test_seed(61);
  auto ex1 = make_executor(1), ex2 = make_executor(2);
  auto same_double = [](double a, double b) { return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b); };
  int checked = 0;
  for (const auto& [name, config] : configs()) {
    const bool adam = std::holds_alternative<AdamConfig>(config);
    for (StateType st : {StateType::kF32, StateType::kBF16, StateType::kQ8}) {
      if (!adam && st != StateType::kF32) continue;
      for (DType g : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (int64_t n :
             {int64_t{1}, int64_t{1023}, int64_t{1024}, int64_t{1280}, int64_t{4096 + 37}, int64_t{70001}}) {
          for (Isa isa : available_isas()) {
            for (bool bad : {false, true}) {
              SCOPED_TRACE(name + " " + std::string(state_type_name(st)) + " grad " + std::string(dtype_name(g)) +
                           " n " + std::to_string(n) + " " + std::string(isa_name(isa)) + (bad ? " non-finite" : ""));
              Problem p(n, g, true, DType::kBF16, st, seed);
              p.fill_grad(seed + 1);
              if (bad) {
                p.set_grad(n / 2, std::numeric_limits<float>::infinity());
                p.set_grad(n - 1, std::numeric_limits<float>::quiet_NaN());
              }
              Result<GradStats> want = grad_stats(p.span().grad, g, n, 0.37f, *ex2, isa);
              ASSERT_TRUE(want) << want.error().to_string();
              Problem plain = p;
              StepOptions o;
              o.isa = isa;
              o.grad_scale = 0.37f;
              o.nonfinite = NonFinitePolicy::kReportOnly;
              ASSERT_TRUE(step(config, 2, plain.span(), o, *ex2));
              for (int threads : {1, 2}) {
                for (int64_t tile : {int64_t{4096}, int64_t{1} << 16}) {
                  Problem q = p;
                  GradStats got;
                  o.stats = &got;
                  o.tile_elems = tile;
                  Result<StepReport> r = step(config, 2, q.span(), o, threads == 1 ? *ex1 : *ex2);
                  ASSERT_TRUE(r) << r.error().to_string();
                  EXPECT_TRUE(same_double(got.sum_squares, want->sum_squares))
                      << got.sum_squares << " vs " << want->sum_squares << ", " << threads << " threads, tile " << tile;
                  EXPECT_EQ(got.nonfinite, want->nonfinite);
                  EXPECT_EQ(r->nonfinite, want->nonfinite);
                  EXPECT_EQ(std::memcmp(q.params.data(), plain.params.data(), q.params.size() * 4), 0);
                  EXPECT_EQ(q.m, plain.m);
                  EXPECT_EQ(q.v, plain.v);
                  EXPECT_EQ(q.out, plain.out);
                  EXPECT_EQ(q.m_scale, plain.m_scale);
                  ++checked;
                }
              }
              o.stats = nullptr;
              o.tile_elems = StepOptions{}.tile_elems;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);

  // Spans stepped in turn into one GradStats add up to one grad_stats over
  // all of them (all but the last a multiple of kGradStatsPartialElems);
  // with kSkipStep the pre-pass gives them.
  const int64_t n = 3 * 4096 + 1000;
  for (NonFinitePolicy policy : {NonFinitePolicy::kReportOnly, NonFinitePolicy::kSkipStep}) {
    Problem p(n, DType::kBF16, true, DType::kBF16, StateType::kF32, seed);
    p.fill_grad(seed + 2);
    Result<GradStats> want = grad_stats(p.span().grad, DType::kBF16, n, 0.5f, *ex2);
    ASSERT_TRUE(want);
    GradStats got;
    StepOptions o;
    o.grad_scale = 0.5f;
    o.nonfinite = policy;
    o.stats = &got;
    for (int64_t begin : {int64_t{0}, int64_t{4096}, int64_t{2 * 4096}}) {
      ParamSpan s = p.span();
      const int64_t len = begin == 2 * 4096 ? n - begin : 4096;
      s.params += begin;
      s.grad = static_cast<const std::byte*>(s.grad) + begin * 2;
      s.weights_out = static_cast<std::byte*>(s.weights_out) + begin * 2;
      s.state.m = static_cast<float*>(s.state.m) + begin;
      s.state.v = static_cast<float*>(s.state.v) + begin;
      s.n = len;
      ASSERT_TRUE(step(AdamConfig{}, 1, s, o, *ex2));
    }
    EXPECT_TRUE(same_double(got.sum_squares, want->sum_squares)) << got.sum_squares << " vs " << want->sum_squares;
    EXPECT_EQ(got.nonfinite, 0);
  }
}

// An fp32 weights_out (fp32 working weights) is a copy of the new params,
// bit for bit, in place and out of place, at any thread count.
TEST(Optimizer, AnFp32WeightsOutIsTheNewParams) {
  for (int threads : {1, 3}) {
    auto ex = make_executor(threads);
    for (int64_t n : {int64_t{1}, int64_t{4097}, int64_t{70000}}) {
      Problem p(n, DType::kBF16, false, DType::kBF16, StateType::kF32, 7);
      p.fill_grad(11);
      std::vector<float> out(static_cast<size_t>(n), -1.0f);
      ParamSpan span = p.span();
      span.weights_out = out.data();
      span.out_dtype = DType::kF32;
      StepOptions o;
      o.tile_elems = 4096;
      ASSERT_TRUE(step(AdamConfig{}, 1, span, o, *ex).has_value());
      EXPECT_EQ(0, std::memcmp(out.data(), span.params, static_cast<size_t>(n) * 4)) << n << " elements";
      std::vector<float> next(static_cast<size_t>(n)), m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
      span.params_next = next.data();
      span.state_next.m = m.data();
      span.state_next.v = v.data();
      ASSERT_TRUE(step(AdamConfig{}, 2, span, o, *ex).has_value());
      EXPECT_EQ(0, std::memcmp(out.data(), next.data(), static_cast<size_t>(n) * 4)) << n << " out of place";
    }
  }
}

TEST(Optimizer, BadArgumentsAreInvalidArgument) {
  auto ex = make_executor(1);
  Problem p(100, DType::kF32, false, DType::kBF16, StateType::kF32, 1);
  AdamConfig adam;
  EXPECT_EQ(step(adam, 0, p.span(), {}, *ex).error().code(), StatusCode::kInvalidArgument);
  AdamConfig bad_beta;
  bad_beta.beta1 = 1.0f;
  EXPECT_EQ(step(bad_beta, 1, p.span(), {}, *ex).error().code(), StatusCode::kInvalidArgument);
  AdamConfig nan_lr;
  nan_lr.lr = std::nanf("");
  EXPECT_EQ(step(nan_lr, 1, p.span(), {}, *ex).error().code(), StatusCode::kInvalidArgument);
  ParamSpan no_grad = p.span();
  no_grad.grad = nullptr;
  EXPECT_EQ(step(adam, 1, no_grad, {}, *ex).error().code(), StatusCode::kInvalidArgument);
  Problem q(100, DType::kF32, false, DType::kBF16, StateType::kQ8, 1);
  Result<StepReport> lion_q8 = step(LionConfig{}, 1, q.span(), {}, *ex);
  ASSERT_FALSE(lion_q8);
  EXPECT_NE(lion_q8.error().message().find("Adam"), std::string::npos);
  SgdConfig nesterov;
  nesterov.nesterov = true;
  EXPECT_EQ(step(nesterov, 1, p.span(), {}, *ex).error().code(), StatusCode::kInvalidArgument);
  // A non-finite gradient scale (a loss scale of 0 inverted, say) would
  // make every step NaN; a tile of no elements cannot be cut.
  const std::vector<float> before = p.params;
  for (float scale : {INFINITY, -INFINITY, std::nanf("")}) {
    StepOptions o;
    o.grad_scale = scale;
    Result<StepReport> r = step(adam, 1, p.span(), o, *ex);
    ASSERT_FALSE(r) << scale;
    EXPECT_NE(r.error().message().find("grad_scale"), std::string::npos) << r.error().to_string();
    Result<GradStats> g = grad_stats(p.span().grad, DType::kF32, p.n, scale, *ex);
    ASSERT_FALSE(g) << scale;
    EXPECT_NE(g.error().message().find("grad_scale"), std::string::npos) << g.error().to_string();
  }
  for (int64_t tile : {int64_t{0}, int64_t{-4096}}) {
    StepOptions o;
    o.tile_elems = tile;
    EXPECT_EQ(step(adam, 1, p.span(), o, *ex).error().code(), StatusCode::kInvalidArgument) << tile;
  }
  EXPECT_EQ(p.params, before);
  EXPECT_EQ(Executor::create({-1, -1}).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Executor::create({1, 4096}).error().code(), StatusCode::kInvalidArgument);
}

// Buffers that overlap where the call writes, or that are not aligned to
// their elements, are refused before anything is touched, the message
// naming them; buffers the call only reads may share memory, and arrays
// the optimizer does not use are not looked at.
TEST(Optimizer, OverlappingOrMisalignedBuffersAreRefusedAndNothingIsTouched) {
  auto ex = make_executor(2);
  const int64_t n = 4099;
  Problem p(n, DType::kBF16, true, DType::kBF16, StateType::kF32, 3);
  p.fill_grad(4);
  ASSERT_TRUE(step(AdamConfig{}, 1, p.span(), {}, *ex));  // non-zero states to keep
  const Problem kept = p;
  auto refused = [&](const ParamSpan& span, const OptimizerConfig& config, const std::string& a, const std::string& b) {
    Result<StepReport> r = step(config, 2, span, {}, *ex);
    ASSERT_FALSE(r) << a << " / " << b;
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
    const std::string msg(r.error().message());
    EXPECT_NE(msg.find(a), std::string::npos) << msg;
    EXPECT_NE(msg.find(b), std::string::npos) << msg;
    EXPECT_EQ(std::memcmp(p.params.data(), kept.params.data(), p.params.size() * 4), 0) << msg;
    EXPECT_EQ(p.m, kept.m) << msg;
    EXPECT_EQ(p.v, kept.v) << msg;
    EXPECT_EQ(p.out, kept.out) << msg;
    EXPECT_EQ(p.grad, kept.grad) << msg;
  };
  const AdamConfig adam;
  ParamSpan s = p.span();
  ParamSpan x = s;  // the bf16 weights written over the second half of the fp32 params
  x.weights_out = s.params + n / 2;
  refused(x, adam, "weights_out", "params");
  x = s;  // m running into v by one element
  x.state.m = static_cast<std::byte*>(s.state.v) - 4 * (n - 1);
  refused(x, adam, "m", "v");
  x = s;  // the gradient under the weights being written: refused although both are bf16
  x.weights_out = const_cast<void*>(s.grad);
  refused(x, adam, "grad", "weights_out");
  x = s;  // out of place, the new params one element on from the old
  x.params_next = s.params + 1;
  x.state_next = s.state;
  refused(x, adam, "params", "params_next");
  x = s;  // a bf16 gradient one byte off its elements
  x.grad = static_cast<const std::byte*>(s.grad) + 1;
  x.n = n - 1;
  refused(x, adam, "grad", "aligned");
  x = s;
  x.params = reinterpret_cast<float*>(reinterpret_cast<std::byte*>(s.params) + 2);
  x.n = n - 1;
  refused(x, adam, "params", "aligned");

  // Out of place, the old params may be the gradient's memory too (both only
  // read): accepted, and the same bits as from a separate copy of them.
  Problem alias(n, DType::kF32, false, DType::kBF16, StateType::kF32, 5);
  Problem apart = alias;
  std::memcpy(alias.grad.data(), alias.params.data(), alias.params.size() * 4);
  std::memcpy(apart.grad.data(), apart.params.data(), apart.params.size() * 4);
  std::vector<float> next_alias(alias.params.size()), next_apart(apart.params.size());
  std::vector<std::byte> m_alias(alias.m.size()), v_alias(alias.v.size()), m_apart(apart.m.size()),
      v_apart(apart.v.size());
  ParamSpan a = alias.span();
  a.grad = a.params;
  a.params_next = next_alias.data() + 1;
  a.state_next = {StateType::kF32, m_alias.data() + 4, v_alias.data() + 4, nullptr, nullptr};
  ParamSpan b = apart.span();
  b.params_next = next_apart.data() + 1;
  b.state_next = {StateType::kF32, m_apart.data() + 4, v_apart.data() + 4, nullptr, nullptr};
  ASSERT_TRUE(step(adam, 1, a, {}, *ex));
  ASSERT_TRUE(step(adam, 1, b, {}, *ex));
  EXPECT_EQ(next_alias, next_apart);
  EXPECT_EQ(m_alias, m_apart);
  EXPECT_EQ(v_alias, v_apart);
  // SGD without momentum keeps no state: its m, here the params' own
  // memory, is not looked at.
  ParamSpan sgd = p.span();
  sgd.state.m = sgd.params;
  sgd.state.v = sgd.params;
  EXPECT_TRUE(step(SgdConfig{}, 1, sgd, {}, *ex));

  // The conversions and the 8-bit format on their own.
  std::vector<float> f(1000, 1.5f);
  EXPECT_EQ(convert(f.data(), DType::kF32, f.data() + 100, DType::kBF16, 500).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(convert(f.data(), DType::kF32, f.data(), DType::kF32, 500, *ex).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(convert(reinterpret_cast<std::byte*>(f.data()) + 2, DType::kF32, f.data() + 600, DType::kBF16, 10).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(convert(f.data(), DType::kF32, f.data() + 500, DType::kBF16, 500).ok());  // just apart
  std::vector<uint8_t> codes(600);
  EXPECT_EQ(q8_encode(f.data(), 512, Q8Array::kM, codes.data(), reinterpret_cast<float*>(codes.data() + 508)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(q8_encode(f.data(), 512, Q8Array::kM, codes.data(), reinterpret_cast<float*>(codes.data() + 512)).ok());
  EXPECT_EQ(q8_decode(codes.data(), reinterpret_cast<float*>(codes.data() + 512), 512, Q8Array::kM,
                      reinterpret_cast<float*>(codes.data()))
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(grad_stats(reinterpret_cast<std::byte*>(f.data()) + 1, DType::kBF16, 10, 1.0f, *ex).error().code(),
            StatusCode::kInvalidArgument);
}

// A gradient whose square overflows fp32 (|g| > 1.8e19) but whose
// (1 - beta2) g g does not: torch.optim.AdamW (1.13) computes
// addcmul_(g, g, value=1 - beta2) left to right, keeps v finite and takes
// the step — lr 10, weight decay 0.01, g 1e20 and 3e19 from p = 1 give
// -9.0999994 for both (run here). So do the reference and every
// instruction set, over fp32 and bf16 states (the reference squared g
// first and took no step: 0.9).
TEST(Optimizer, AGradientWhoseSquareOverflowsStepsAsTorchDoes) {
  auto ex = make_executor(1);
  AdamConfig adamw;
  adamw.lr = 10.0f;
  adamw.weight_decay = 0.01f;
  for (StateType state : {StateType::kF32, StateType::kBF16}) {
    for (Isa isa : available_isas()) {
      SCOPED_TRACE(std::string(isa_name(isa)) + (state == StateType::kF32 ? " fp32" : " bf16") + " states");
      const int64_t n = 35;
      Problem p(n, DType::kF32, false, DType::kBF16, state, 3);
      for (int64_t i = 0; i < n; ++i) {
        p.params[p.skew + i] = 1.0f;
        p.set_grad(i, i % 2 == 0 ? 1e20f : -3e19f);
      }
      StepOptions options;
      options.isa = isa;
      Result<StepReport> r = step(adamw, 1, p.span(), options, *ex);
      ASSERT_TRUE(r) << r.error().to_string();
      EXPECT_EQ(r->nonfinite, 0);
      // p * (1 - lr wd) - lr / (1 - beta1) * m / (sqrt(v) / sqrt(1 - beta2)):
      // 0.9 -+ 10, m / sqrt(v / (1 - beta2)) being +-1 at t = 1.
      for (int64_t i = 0; i < n; ++i) {
        const float want = i % 2 == 0 ? -9.1f : 10.9f;
        EXPECT_NEAR(p.params[p.skew + i], want, 2e-3 * std::fabs(want)) << i;
      }
    }
  }
}

// Adam's and Adagrad's eps is any finite number >= 0, as torch.optim's.
// An eps too small for the kernels' estimates (0, subnormal, FLT_MIN,
// 1e-30 here: eps sqrt(bc2) below 2^-49) takes the reference's exact roots
// and divisions on every instruction set: where v is 0 (a zero state and a
// gradient whose square underflows) eps = 0 gives the reference's m / 0,
// +-inf weights; where v is subnormal or 0 a tiny eps gives its huge finite
// step; where v is inf, no step. eps = 1e-8 takes the estimates, within
// their error of the reference's step. A negative eps is refused, by
// step() — which leaves the span as it was — and by validate(). (Before,
// AVX2 gave NaN where the reference gave inf at eps = 0, the bf16 and 8-bit
// states' estimates a step orders of magnitude too small at eps = FLT_MIN
// or 1e-30 where v was 0, and a subnormal eps was refused.)
TEST(Optimizer, EpsBelowTheSmallestNormalTakesTheReferencesExactSteps) {
  auto ex = make_executor(2);
  // No L2 decay: it would add wd p to the tiny gradients, and v would not
  // be 0.
  AdamConfig adam;
  adam.decoupled_weight_decay = false;
  AdamConfig adamw;
  adamw.weight_decay = 0.1f;
  AdagradConfig adagrad;
  const std::vector<std::pair<std::string, OptimizerConfig>> all = {
      {"adam", adam}, {"adamw", adamw}, {"adagrad", adagrad}};
  for (const auto& entry : all) {
    const std::string& name = entry.first;
    OptimizerConfig config = entry.second;  // a copy: its eps is set below (not a binding: lambdas capture it)
    const bool is_adam = std::holds_alternative<AdamConfig>(config);
    auto set_eps = [&config](float e) {
      if (auto* a = std::get_if<AdamConfig>(&config)) a->eps = e;
      if (auto* a = std::get_if<AdagradConfig>(&config)) a->eps = e;
    };
    for (float eps : {0.0f, 1e-40f, FLT_MIN, 1e-30f, 1e-8f}) {
      const bool exact = eps < 1e-20f;  // eps sqrt(bc2) < 2^-49 at t = 3
      set_eps(eps);
      ASSERT_TRUE(validate(config).ok()) << validate(config).to_string();
      for (StateType state : {StateType::kF32, StateType::kBF16, StateType::kQ8}) {
        if (!is_adam && state != StateType::kF32) continue;
        for (int64_t n : {int64_t{67}, int64_t{2 * kQ8BlockElems + 3}}) {
          // Gradients 0, 1e-30 and -2e-30 (squares that underflow), m +-0.1
          // and v the specials; 8-bit states start from zero blocks.
          auto prepare = [&](Problem& p) {
            for (int64_t i = 0; i < n; ++i) {
              p.set_grad(i, i % 3 == 0 ? 0.0f : (i % 3 == 1 ? 1e-30f : -2e-30f));
              if (state != StateType::kQ8) {
                p.set_state(i, i % 2 == 0 ? 0.1f : -0.1f, kSecondMomentSpecials[i % kSecondMomentSpecials.size()]);
              }
            }
          };
          char eps_text[32];
          std::snprintf(eps_text, sizeof eps_text, "%g", static_cast<double>(eps));
          const std::string where =
              name + " eps " + eps_text + " " + std::string(state_type_name(state)) + " states, n " + std::to_string(n);
          Problem start(n, DType::kF32, true, DType::kBF16, state, 5);
          prepare(start);
          Problem ref = start;
          ASSERT_NO_FATAL_FAILURE(step_once(config, Isa::kScalar, ref, *ex));
          int64_t infinite = 0;
          for (int64_t i = 0; i < n; ++i) infinite += std::isinf(ref.params[ref.skew + i]) ? 1 : 0;
          // The case is there: eps 0 divides by a zero v (fp32 and bf16
          // states' zeros, the 8-bit states' zero blocks); a normal eps
          // never (a subnormal one may overflow lr m / eps).
          if (eps == 0.0f) {
            EXPECT_GT(infinite, 0) << where;
          } else if (eps >= FLT_MIN) {
            EXPECT_EQ(infinite, 0) << where;
          }
          for (Isa isa : available_isas()) {
            if (isa == Isa::kScalar) continue;
            SCOPED_TRACE(where + " isa " + std::string(isa_name(isa)));
            Problem got = start;
            ASSERT_NO_FATAL_FAILURE(step_once(config, isa, got, *ex));
            if (exact || state == StateType::kF32) {
              // 8-bit states: where lr m / eps makes the steps millions, an
              // fp32 ulp of them is above the states' absolute bound.
              std::optional<Tolerance> ptol;
              if (state == StateType::kQ8) ptol = Tolerance{testing::kQ8Params.atol, testing::kF32Params.rtol};
              expect_close(got, ref, config, ptol);
              continue;
            }
            expect_coarse_steps_close(got, ref, start.params);  // low-precision states, eps = 1e-8
          }
        }
      }
    }
    set_eps(-1e-30f);
    const Status v = validate(config);
    EXPECT_EQ(v.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(v.message().find("eps"), std::string::npos) << v.to_string();
    Problem p(67, DType::kF32, true, DType::kBF16, StateType::kF32, 5);
    const std::vector<float> before = p.params;
    const std::vector<std::byte> m_before = p.m, v_before = p.v;
    for (Isa isa : available_isas()) {
      StepOptions options;
      options.isa = isa;
      Result<StepReport> r = step(config, 1, p.span(), options, *ex);
      ASSERT_FALSE(r) << name;
      EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(std::memcmp(p.params.data(), before.data(), before.size() * 4), 0);
      EXPECT_TRUE(p.m == m_before && p.v == v_before);
    }
  }
  AdamConfig tiny_lr;
  tiny_lr.lr = -1e-9;
  const Status lr = validate(tiny_lr);
  EXPECT_NE(lr.message().find("got -1e-09"), std::string::npos) << lr.to_string();  // not -0.000000
}

TEST(Executor, BindsToNumaNodeZeroAndFirstTouches) {
  Result<std::unique_ptr<Executor>> ex = Executor::create({0, 0});
  ASSERT_TRUE(ex) << ex.error().to_string();
  EXPECT_GE((*ex)->threads(), 1);
  std::vector<float> buf(1 << 20, 1.0f);
  ASSERT_TRUE((*ex)->first_touch(buf.data(), buf.size() * 4).ok());
  EXPECT_EQ(buf[12345], 1.0f);  // touching never changes data
}

}  // namespace
}  // namespace strata::cpu_optim
