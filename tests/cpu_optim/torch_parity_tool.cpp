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
  const auto num = [&j](const char* key) { return j.at(key).get<double>(); };
  if (name == "adam" || name == "adamw") {
    return AdamConfig{.lr = num("lr"),
                      .beta1 = num("beta1"),
                      .beta2 = num("beta2"),
                      .eps = num("eps"),
                      .weight_decay = num("weight_decay"),
                      .decoupled_weight_decay = name == "adamw"};
  }
  if (name == "adagrad") {
    return AdagradConfig{
        .lr = num("lr"), .lr_decay = num("lr_decay"), .weight_decay = num("weight_decay"), .eps = num("eps")};
  }
  if (name == "sgd") {
    return SgdConfig{.lr = num("lr"),
                     .momentum = num("momentum"),
                     .dampening = num("dampening"),
                     .weight_decay = num("weight_decay"),
                     .nesterov = j.at("nesterov").get<bool>()};
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
  for (size_t t = 0; t < grads.size(); ++t) {
    if (grads[t].size() != initial.size()) {
      std::fprintf(stderr, "step %zu: %zu gradients for %lld params\n", t + 1, grads[t].size(),
                   static_cast<long long>(n));
      return 2;
    }
  }
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
    // Both arrays whatever the optimizer (one it does not use stays 0).
    span.state.m = m.data();
    span.state.v = v.data();
    strata::cpu_optim::StepOptions options;
    options.isa = isa;
    for (size_t t = 0; t < grads.size(); ++t) {
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
