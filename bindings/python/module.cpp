// _strata: the native half of the strata Python package (strata/*.py is
// the other). It takes buffers as (address, elements, dtype name, writable)
// tuples that strata/_buffers.py makes from NumPy arrays and torch tensors
// without copying them, checks every length, dtype and write permission
// against the others, and runs cpu_optim on them with the GIL released.
// Errors raise ValueError (bad values, lengths, alignment) or TypeError
// (dtypes) carrying the C++ message; nothing is written then.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "bindings/python/aio.h"
#include "bindings/python/safetensors.h"
#include "bindings/python/session.h"
#include "bindings/python/trainer.h"
#include "cpu_optim/executor.h"
#include "cpu_optim/optimizer.h"

namespace py = pybind11;
using namespace strata;
using namespace strata::cpu_optim;

namespace {

// One array the caller handed in, as strata/_buffers.py describes it.
struct Buffer {
  std::string name;  // the argument's name, for messages
  uintptr_t address = 0;
  int64_t elements = 0;
  std::string dtype;  // float32, bfloat16, float16, int8, uint8, ...
  bool writable = false;
};

std::optional<Buffer> buffer_arg(const py::dict& buffers, const char* name) {
  if (!buffers.contains(name) || buffers[name].is_none()) return std::nullopt;
  auto t = buffers[name].cast<std::tuple<uintptr_t, int64_t, std::string, bool>>();
  return Buffer{name, std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t)};
}

[[noreturn]] void type_error(const std::string& m) { throw py::type_error(m); }
[[noreturn]] void value_error(const std::string& m) { throw py::value_error(m); }

Buffer required(const py::dict& buffers, const char* name) {
  std::optional<Buffer> b = buffer_arg(buffers, name);
  if (!b) value_error(std::string(name) + " is required");
  return *b;
}

void expect_len(const Buffer& b, int64_t n, const char* of) {
  if (b.elements != n) {
    value_error(b.name + ": " + std::to_string(b.elements) + " elements, but " + of + " has " + std::to_string(n));
  }
}

void expect_writable(const Buffer& b) {
  if (!b.writable) value_error(b.name + " is read-only: the step writes it in place");
}

DType grad_dtype(const Buffer& g) {
  if (g.dtype == "float32") return DType::kF32;
  if (g.dtype == "bfloat16") return DType::kBF16;
  if (g.dtype == "float16") return DType::kF16;
  type_error(g.name + ": expected float32, bfloat16 or float16, got " + g.dtype);
}

double get(const py::dict& h, const char* key, double fallback) {
  return h.contains(key) ? h[key].cast<double>() : fallback;
}

OptimizerConfig optimizer_config(const std::string& kind, const py::dict& h) {
  if (kind == "adam" || kind == "adamw") {
    AdamConfig c;
    c.lr = get(h, "lr", c.lr);
    c.beta1 = get(h, "beta1", c.beta1);
    c.beta2 = get(h, "beta2", c.beta2);
    c.eps = get(h, "eps", c.eps);
    c.weight_decay = get(h, "weight_decay", c.weight_decay);
    c.decoupled_weight_decay = kind == "adamw";
    return c;
  }
  if (kind == "adagrad") {
    AdagradConfig c;
    c.lr = get(h, "lr", c.lr);
    c.lr_decay = get(h, "lr_decay", c.lr_decay);
    c.weight_decay = get(h, "weight_decay", c.weight_decay);
    c.eps = get(h, "eps", c.eps);
    return c;
  }
  if (kind == "lion") {
    LionConfig c;
    c.lr = get(h, "lr", c.lr);
    c.beta1 = get(h, "beta1", c.beta1);
    c.beta2 = get(h, "beta2", c.beta2);
    c.weight_decay = get(h, "weight_decay", c.weight_decay);
    return c;
  }
  if (kind == "sgd") {
    SgdConfig c;
    c.lr = get(h, "lr", c.lr);
    c.momentum = get(h, "momentum", c.momentum);
    c.dampening = get(h, "dampening", c.dampening);
    c.weight_decay = get(h, "weight_decay", c.weight_decay);
    c.nesterov = h.contains("nesterov") && h["nesterov"].cast<bool>();
    return c;
  }
  value_error("optimizer: expected adam, adamw, adagrad, lion or sgd, got " + kind);
}

// Adam's states: both fp32, both bf16, or int8 m and uint8 v with their
// fp32 block scales (one per 256 elements).
StateSpans adam_states(const py::dict& buffers, int64_t n) {
  Buffer m = required(buffers, "exp_avg"), v = required(buffers, "exp_avg_sq");
  expect_len(m, n, "params");
  expect_len(v, n, "params");
  expect_writable(m);
  expect_writable(v);
  StateSpans s;
  s.m = reinterpret_cast<void*>(m.address);
  s.v = reinterpret_cast<void*>(v.address);
  if (m.dtype == "float32" && v.dtype == "float32") {
    s.type = StateType::kF32;
  } else if (m.dtype == "bfloat16" && v.dtype == "bfloat16") {
    s.type = StateType::kBF16;
  } else if (m.dtype == "int8" && v.dtype == "uint8") {
    s.type = StateType::kQ8;
    Buffer ms = required(buffers, "exp_avg_scale"), vs = required(buffers, "exp_avg_sq_scale");
    const int64_t blocks = (n + kQ8BlockElems - 1) / kQ8BlockElems;
    for (const Buffer* b : {&ms, &vs}) {
      if (b->dtype != "float32") type_error(b->name + ": expected float32 block scales, got " + b->dtype);
      expect_len(*b, blocks, "one scale per 256 params");
      expect_writable(*b);
    }
    s.m_scale = reinterpret_cast<float*>(ms.address);
    s.v_scale = reinterpret_cast<float*>(vs.address);
  } else {
    type_error("exp_avg, exp_avg_sq: expected both float32, both bfloat16, or int8 and uint8 (8-bit states), got " +
               m.dtype + " and " + v.dtype);
  }
  return s;
}

// A one-array fp32 state (Adagrad's sum, Lion's and SGD's momentum).
StateSpans fp32_state(const py::dict& buffers, const char* name, int64_t n, bool is_m) {
  Buffer b = required(buffers, name);
  expect_len(b, n, "params");
  expect_writable(b);
  if (b.dtype != "float32") type_error(b.name + ": expected float32, got " + b.dtype);
  StateSpans s;
  (is_m ? s.m : s.v) = reinterpret_cast<void*>(b.address);
  return s;
}

class Threads {
 public:
  Executor& get() {
    std::lock_guard lock(mu_);
    if (!executor_) executor_ = make(threads_);
    return *executor_;
  }
  void set(int threads) {
    if (threads < 0) value_error("threads: expected 0 (every core) or more, got " + std::to_string(threads));
    std::lock_guard lock(mu_);
    executor_ = make(threads);
    threads_ = threads;
  }
  int count() { return get().threads(); }

 private:
  static std::unique_ptr<Executor> make(int threads) {
    Result<std::unique_ptr<Executor>> e = Executor::create(ExecutorOptions{.threads = threads});
    if (!e) value_error(std::string(e.error().message()));
    return std::move(*e);
  }
  std::mutex mu_;
  std::unique_ptr<Executor> executor_;
  int threads_ = 0;
};

Threads& threads() {
  static Threads t;
  return t;
}

// One optimizer step on one span: returns (non-finite gradient elements,
// skipped). `buffers` maps argument names to buffer tuples.
py::tuple run_step(const std::string& kind, const py::dict& hyper, int64_t t, const py::dict& buffers,
               double grad_scale, bool skip_nonfinite) {
  const OptimizerConfig config = optimizer_config(kind, hyper);
  if (Status s = validate(config); !s.ok()) value_error(std::string(s.message()));
  if (t < 1) value_error("step: the step count starts at 1, got " + std::to_string(t));
  Buffer p = required(buffers, "params");
  if (p.dtype != "float32") type_error("params: expected float32 master weights, got " + p.dtype);
  expect_writable(p);
  Buffer g = required(buffers, "grads");
  expect_len(g, p.elements, "params");
  ParamSpan span;
  span.params = reinterpret_cast<float*>(p.address);
  span.n = p.elements;
  span.grad = reinterpret_cast<const void*>(g.address);
  span.grad_dtype = grad_dtype(g);
  if (std::optional<Buffer> out = buffer_arg(buffers, "weights_out")) {
    expect_len(*out, p.elements, "params");
    expect_writable(*out);
    if (out->dtype == "bfloat16") {
      span.out_dtype = DType::kBF16;
    } else if (out->dtype == "float16") {
      span.out_dtype = DType::kF16;
    } else {
      type_error("weights_out: expected bfloat16 or float16, got " + out->dtype);
    }
    span.weights_out = reinterpret_cast<void*>(out->address);
  }
  if (kind == "adam" || kind == "adamw") {
    span.state = adam_states(buffers, p.elements);
  } else if (kind == "adagrad") {
    span.state = fp32_state(buffers, "sum", p.elements, /*is_m=*/false);
  } else if (kind == "lion") {
    span.state = fp32_state(buffers, "exp_avg", p.elements, /*is_m=*/true);
  } else if (std::get<SgdConfig>(config).momentum != 0) {
    span.state = fp32_state(buffers, "momentum_buffer", p.elements, /*is_m=*/true);
  }
  StepOptions options;
  options.grad_scale = static_cast<float>(grad_scale);
  options.nonfinite = skip_nonfinite ? NonFinitePolicy::kSkipStep : NonFinitePolicy::kReportOnly;
  Executor& executor = threads().get();
  Result<StepReport> report = [&] {
    py::gil_scoped_release unlocked;
    return cpu_optim::step(config, t, span, options, executor);
  }();
  if (!report) value_error(std::string(report.error().message()));
  return py::make_tuple(report->nonfinite, report->skipped);
}

}  // namespace

PYBIND11_MODULE(_strata, m) {
  m.doc() = "strata's native module: use the strata package (strata.optim, strata.torch) instead";
  m.attr("__version__") = STRATA_PYTHON_VERSION;
  m.def("step", &run_step, py::arg("kind"), py::arg("hyper"), py::arg("t"), py::arg("buffers"), py::arg("grad_scale"),
        py::arg("skip_nonfinite"));
  m.def("set_num_threads", [](int n) { threads().set(n); }, py::arg("threads"));
  m.def("get_num_threads", [] { return threads().count(); });
  m.def("isa", [] { return std::string(isa_name(available_isas().front())); });
  m.attr("Q8_BLOCK") = kQ8BlockElems;
  strata::python::add_aio(m);
  strata::python::add_trainer(m);
  strata::python::add_session(m);
  strata::python::add_safetensors(m);
}
