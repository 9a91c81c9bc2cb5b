// cpu_optim: optimizers on flat spans of parameters, at memory bandwidth.
//
// One call updates one span (normally one chunk): fp32 master weights in
// place, optimizer states in place, and — optionally, fused in the same pass —
// writes the updated weights as bf16/fp16 into a second buffer (what goes
// back to the GPU). Gradients may be fp32, fp16 or bf16; they are multiplied by
// `grad_scale` (1/loss_scale times the clip factor) in the same pass.
//
// Formulas follow PyTorch's documentation for torch.optim.{Adam, AdamW,
// Adagrad, SGD} (version 1.13) and the Lion paper (Chen et al. 2023,
// "Symbolic Discovery of Optimization Algorithms", Algorithm 2); see
// optim_ref.cpp, the plain scalar reference each vector kernel is tested
// against. The step count t is supplied by the caller (1 on the first step).
//
// Execution: the span is cut into tiles run by oneTBB in the Executor's arena;
// each tile is processed in L1-sized sub-tiles by the vector kernel of the
// best instruction set the CPU supports among those compiled in (chosen at
// run time by `available_isas` in optimizer.cpp, which reads CPUID and
// XCR0 itself; each kernel file is built for one xsimd architecture), or
// the one forced in StepOptions.
// Results are bit-identical for every thread count and tile size.
#pragma once

#include <cstdint>
#include <string_view>
#include <variant>
#include <vector>

#include "common/status.h"
#include "cpu_optim/dtype.h"

namespace strata::cpu_optim {

class Executor;

// Hyper-parameters are doubles, as torch.optim's are (Python floats): the
// per-step coefficients — 1 - beta, the bias corrections, lr / (1 - beta1^t),
// 1 - lr * weight_decay — are computed in double and rounded to fp32 once,
// so 1 - beta2 for beta2 = 0.999 is 0.001 and not 1 - 0.999f (1.3e-5 off;
// 1.7e-4 for 0.9999), and v follows torch's.
struct AdamConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  // Any finite eps >= 0. One whose eps * sqrt(1 - beta2^t) is below 2^-49
  // (at beta2 = 0.999, eps below 5.6e-14; 0 too) is too small for the
  // kernels' root and reciprocal estimates: such steps take exact roots and
  // divisions, 2.4-3.3 x slower (docs/CPU_OPTIM.md).
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = true;  // true: AdamW; false: Adam's L2 (wd * p added to g)
};

struct AdagradConfig {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double eps = 1e-10;  // as Adam's (with no bias correction): below 2^-49 (1.8e-15), exact roots and divisions
};

struct LionConfig {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double weight_decay = 0.0;
};

struct SgdConfig {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

using OptimizerConfig = std::variant<AdamConfig, AdagradConfig, LionConfig, SgdConfig>;

std::string_view optimizer_name(const OptimizerConfig& config);
// How many state arrays the optimizer keeps per parameter (Adam 2, Adagrad 1,
// Lion 1, SGD 1 with momentum, else 0).
int state_count(const OptimizerConfig& config);

// States of one span. `m` is Adam's first moment, Lion's and SGD's momentum;
// `v` is Adam's second moment, Adagrad's sum of squares. For kQ8, m_scale and
// v_scale hold one float per kQ8BlockElems elements (ceil(n / 256)); m is
// int8 and v uint8. Low-precision states (kBF16, kQ8) are for Adam/AdamW.
struct StateSpans {
  StateType type = StateType::kF32;
  void* m = nullptr;
  void* v = nullptr;
  float* m_scale = nullptr;
  float* v_scale = nullptr;
};

struct ParamSpan {
  float* params = nullptr;         // fp32 master weights, n elements, updated in place (or see params_next)
  int64_t n = 0;
  const void* grad = nullptr;      // n elements of grad_dtype
  DType grad_dtype = DType::kF32;
  void* weights_out = nullptr;     // optional: n elements of out_dtype, written from the new params
  DType out_dtype = DType::kBF16;  // kBF16, kF16, or kF32 (a copy of the new params)
  StateSpans state;
  // Optional, both or neither: the update out of place. The new params and
  // states are written here (same type and length as `params` / `state`),
  // and `params` and `state` are only read — what a caller that may have to
  // roll the step back keeps. The same bits as the update in place.
  float* params_next = nullptr;
  StateSpans state_next;
};

// kAvx512Bf16: the AVX-512 kernels rounding to bf16 with AVX-512 BF16's
// instruction (the same bits; faster in cache, a few percent at memory speed).
enum class Isa : uint8_t { kAuto, kScalar, kSse2, kAvx2, kAvx512, kAvx512Bf16 };
std::string_view isa_name(Isa isa);
// The inverse of isa_name ("auto", "avx512_bf16", ...); InvalidArgument otherwise.
Result<Isa> parse_isa(std::string_view name);
// Instruction sets compiled in AND supported by this CPU, best first (kScalar last).
std::vector<Isa> available_isas();

enum class NonFinitePolicy : uint8_t {
  // Scan the gradient first; if any element is inf/nan, update nothing and
  // report it. Costs one extra read of the gradient.
  kSkipStep,
  // One pass: count non-finite gradient elements while updating. Parameters
  // whose gradient was inf/nan get non-finite values; the caller rolls the
  // span back (the engine's speculative update does exactly that).
  kReportOnly,
};

struct GradStats {
  double sum_squares = 0;  // of the scaled finite elements, accumulated in fp64
  int64_t nonfinite = 0;
};

struct StepOptions {
  float grad_scale = 1.0f;  // multiplies every gradient: (1 / loss_scale) * clip factor
  NonFinitePolicy nonfinite = NonFinitePolicy::kSkipStep;
  Isa isa = Isa::kAuto;
  int64_t tile_elems = 1 << 16;  // rounded up to a multiple of 4096
  // When set, the step also adds to *stats what grad_stats(span.grad,
  // span.grad_dtype, span.n, grad_scale) returns, from the same read of the
  // gradient (the update's own: no second pass): its partials summed in
  // order onto sum_squares, its non-finite count onto nonfinite. Spans
  // stepped one after another into the same GradStats, all but the last a
  // multiple of kGradStatsPartialElems long, give the bits of one
  // grad_stats over their concatenation.
  GradStats* stats = nullptr;
};

struct StepReport {
  int64_t nonfinite = 0;  // gradient elements that were inf or nan
  bool skipped = false;   // true when kSkipStep found any: nothing was written
};

// OK when step() would take `config`'s hyper-parameters (rates and weight
// decays finite and >= 0, betas in [0, 1) (Lion's in [0, 1]), eps finite
// and >= 0, SGD's Nesterov with momentum and no dampening); else
// InvalidArgument naming the one that is not. For checking a configuration
// before any work is done.
Status validate(const OptimizerConfig& config);

// Updates `span` with optimizer step `t` (t >= 1). InvalidArgument for a
// bad config (validate), null pointers, t < 1, a state type the optimizer
// lacks, a buffer not aligned to its elements (params 4 bytes, a bf16
// gradient 2, ...), or a buffer the step writes (params and the states it
// uses in place, their _next twins out of place, weights_out) sharing
// memory with another it reads or writes; nothing is touched then. Buffers
// it only reads may overlap.
Result<StepReport> step(const OptimizerConfig& config, int64_t t, const ParamSpan& span, const StepOptions& options,
                        Executor& executor);

// Sum of squares of grad_scale * g (for the global gradient norm) and the
// count of inf/nan elements, in one read. Deterministic: the same bits for
// any thread count or tile size (fixed kGradStatsPartialElems-element
// partials, summed in order).
Result<GradStats> grad_stats(const void* grad, DType dtype, int64_t n, float grad_scale, Executor& executor,
                             Isa isa = Isa::kAuto);

// Converts n elements between fp32 / bf16 / fp16 with the vector kernels of
// `isa` (bit-identical to dtype.h's scalar conversions). src and dst must
// not overlap (InvalidArgument), and each is aligned to its elements; so
// for q8_encode / q8_decode and grad_stats below.
Status convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n, Isa isa = Isa::kAuto);
// The same on the executor's threads (bit-identical: each element is converted alone).
Status convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n, Executor& executor,
               Isa isa = Isa::kAuto);

// The 8-bit state format (q8.h) on its own: encodes n fp32 values as the
// optimizer stores m (kM) or v (kV) — int8 / uint8 codes and one fp32 scale
// per kQ8BlockElems elements (ceil(n / 256)) — and decodes them back; for
// converting states between StateTypes. Every isa gives the same codes.
enum class Q8Array : uint8_t { kM, kV };
Status q8_encode(const float* src, int64_t n, Q8Array which, void* codes, float* scales, Isa isa = Isa::kAuto);
Status q8_decode(const void* codes, const float* scales, int64_t n, Q8Array which, float* dst, Isa isa = Isa::kAuto);

// Bytes of state storage one array of `n` elements needs, scales included.
uint64_t state_array_bytes(StateType type, int64_t n);

}  // namespace strata::cpu_optim
