// The strata side of torch_parity_test.py: reads a problem as JSON (an
// optimizer and its hyper-parameters, initial fp32 params, one fp32
// gradient per step), runs cpu_optim::step over fp32 states on every
// instruction set this CPU has (the scalar reference among them) and writes,
// per instruction set, the params and states after the last step as JSON.
//
//   cpu_optim_torch_parity_tool problem.json > result.json
//
// Input:  {"optimizer": "adam" | "adamw" | "adagrad" | "sgd", "lr": .., ...,
//          "params": [..], "grads": [[..], ..]}
// Output: {"<isa>": {"params": [..], "m": [..], "v": [..]}, ...}
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "cpu_optim/executor.h"
#include "cpu_optim/optimizer.h"

namespace {

using nlohmann::json;
using strata::cpu_optim::AdagradConfig;
using strata::cpu_optim::AdamConfig;
using strata::cpu_optim::OptimizerConfig;
using strata::cpu_optim::SgdConfig;

OptimizerConfig config_of(const json& j) {
  const std::string name = j.at("optimizer").get<std::string>();
  if (name == "adam" || name == "adamw") {
    AdamConfig a;
    a.lr = j.at("lr").get<double>();
    a.beta1 = j.at("beta1").get<double>();
    a.beta2 = j.at("beta2").get<double>();
    a.eps = j.at("eps").get<double>();
    a.weight_decay = j.at("weight_decay").get<double>();
    a.decoupled_weight_decay = name == "adamw";
    return a;
  }
  if (name == "adagrad") {
    AdagradConfig a;
    a.lr = j.at("lr").get<double>();
    a.lr_decay = j.at("lr_decay").get<double>();
    a.eps = j.at("eps").get<double>();
    a.weight_decay = j.at("weight_decay").get<double>();
    return a;
  }
  if (name == "sgd") {
    SgdConfig s;
    s.lr = j.at("lr").get<double>();
    s.momentum = j.at("momentum").get<double>();
    s.dampening = j.at("dampening").get<double>();
    s.weight_decay = j.at("weight_decay").get<double>();
    s.nesterov = j.at("nesterov").get<bool>();
    return s;
  }
  throw std::runtime_error("unknown optimizer " + name);
}

int run(const char* path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot open %s\n", path);
    return 2;
  }
  const json problem = json::parse(in);
  const OptimizerConfig config = config_of(problem);
  const auto initial = problem.at("params").get<std::vector<float>>();
  const auto grads = problem.at("grads").get<std::vector<std::vector<float>>>();
  const int64_t n = static_cast<int64_t>(initial.size());
  auto executor = strata::cpu_optim::Executor::create();
  if (!executor) {
    std::fprintf(stderr, "%s\n", executor.error().to_string().c_str());
    return 1;
  }
  json out = json::object();
  for (strata::cpu_optim::Isa isa : strata::cpu_optim::available_isas()) {
    std::vector<float> params = initial, m(initial.size(), 0.0f), v(initial.size(), 0.0f);
    strata::cpu_optim::ParamSpan span;
    span.params = params.data();
    span.n = n;
    span.grad_dtype = strata::DType::kF32;
    // Adam: m and v; Adagrad: v (its sum); SGD: m (its momentum) when it has one.
    const bool adam = std::holds_alternative<AdamConfig>(config), adagrad = std::holds_alternative<AdagradConfig>(config);
    span.state.m = adam || (!adagrad && strata::cpu_optim::state_count(config) > 0) ? m.data() : nullptr;
    span.state.v = adam || adagrad ? v.data() : nullptr;
    strata::cpu_optim::StepOptions options;
    options.isa = isa;
    for (size_t t = 0; t < grads.size(); ++t) {
      if (static_cast<int64_t>(grads[t].size()) != n) {
        std::fprintf(stderr, "step %zu: %zu gradients for %lld params\n", t + 1, grads[t].size(),
                     static_cast<long long>(n));
        return 2;
      }
      span.grad = grads[t].data();
      auto r = strata::cpu_optim::step(config, static_cast<int64_t>(t + 1), span, options, **executor);
      if (!r) {
        std::fprintf(stderr, "%s\n", r.error().to_string().c_str());
        return 1;
      }
    }
    out[std::string(strata::cpu_optim::isa_name(isa))] = {{"params", params}, {"m", m}, {"v", v}};
  }
  // Every float's shortest round-tripping text.
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s problem.json\n", argv[0]);
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[1], e.what());
    return 2;
  }
}
