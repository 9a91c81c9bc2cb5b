// strata.Trainer and strata.plan's native half: the built-in GPT trainer
// through the C API (libstrata.so, strata.h), as a trainer in C uses it.
// Every failure raises the Python exception of its strata_status
// (status.h); the GIL is released while strata works.
#include "bindings/python/trainer.h"

#include <pybind11/numpy.h>

#include <cerrno>
#include <string>
#include <vector>

#include "bindings/python/status.h"
#include "strata/strata.h"

namespace py = pybind11;

namespace strata::python {
namespace {

void check(strata_status s) { check_status(s); }

class Trainer {
 public:
  Trainer(const std::string& config_json, const std::string& device, const std::string& resume_dir) {
    strata_status s;
    {
      py::gil_scoped_release unlocked;
      s = resume_dir.empty() ? strata_trainer_create(config_json.c_str(), device.c_str(), &t_)
                             : strata_trainer_resume(config_json.c_str(), device.c_str(), resume_dir.c_str(), &t_);
    }
    check(s);
  }
  ~Trainer() {
    py::gil_scoped_release unlocked;
    strata_trainer_destroy(t_);
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  py::dict shape() const {
    strata_shape sh = STRATA_SHAPE_INIT;
    check(strata_trainer_shape(live(), &sh));
    py::dict d;
    d["grad_accum"] = sh.grad_accum;
    d["batch"] = sh.batch;
    d["seq"] = sh.seq;
    d["vocab"] = sh.vocab;
    return d;
  }

  // tokens/targets: int32 arrays of grad_accum * batch * seq (or both None:
  // the built-in synthetic stream). Returns the step's mean loss.
  float step(const std::optional<py::array_t<int32_t, py::array::c_style>>& tokens,
             const std::optional<py::array_t<int32_t, py::array::c_style>>& targets) {
    if (tokens.has_value() != targets.has_value()) {
      throw py::value_error("step: give both tokens and targets, or neither (the built-in synthetic stream)");
    }
    const int32_t* tk = tokens ? tokens->data() : nullptr;
    const int32_t* tg = targets ? targets->data() : nullptr;
    size_t count = tokens ? static_cast<size_t>(tokens->size()) : 0;
    if (tokens && targets->size() != tokens->size()) {
      throw py::value_error("step: " + std::to_string(tokens->size()) + " tokens but " +
                            std::to_string(targets->size()) + " targets");
    }
    float loss = 0;
    strata_status s;
    {
      py::gil_scoped_release unlocked;
      s = strata_trainer_step(live(), tk, tg, count, &loss);
    }
    check(s);
    return loss;
  }

  int64_t steps_done() const { return strata_trainer_steps_done(live()); }

  void save(const std::string& dir) { run([&] { return strata_trainer_save(live(), dir.c_str()); }); }
  void load(const std::string& dir) { run([&] { return strata_trainer_load(live(), dir.c_str()); }); }
  void finalize() { run([&] { return strata_trainer_finalize(live()); }); }
  void abort() { check(strata_trainer_abort(live())); }
  std::string describe() {
    const char* d = strata_trainer_describe(live());
    return d ? d : "{}";
  }
  void close() {
    if (!t_) return;
    strata_status s;
    {
      py::gil_scoped_release unlocked;
      s = strata_trainer_finalize(t_);
      strata_trainer_destroy(t_);
    }
    t_ = nullptr;
    if (s != STRATA_OK && s != STRATA_CANCELLED) raise_status(s);
  }

 private:
  strata_trainer* live() const {
    if (!t_) throw std::runtime_error("FAILED_PRECONDITION: the trainer is closed");
    return t_;
  }
  template <typename F>
  void run(F f) {
    strata_status s;
    {
      py::gil_scoped_release unlocked;
      s = f();
    }
    check(s);
  }
  strata_trainer* t_ = nullptr;
};

// (the printed plan, whether it fits)
py::tuple plan(const std::string& config_json, const std::string& device) {
  size_t length = 0;
  int fits = 0;
  strata_status s = strata_plan(config_json.c_str(), device.c_str(), nullptr, 0, &length, &fits);
  if (s != STRATA_OK) raise_status(s);
  std::string text(length + 1, '\0');
  check(strata_plan(config_json.c_str(), device.c_str(), text.data(), text.size(), &length, &fits));
  text.resize(length);
  return py::make_tuple(text, fits != 0);
}

}  // namespace

void add_trainer(py::module_& m) {
  py::class_<Trainer>(m, "Trainer")
      .def(py::init<const std::string&, const std::string&, const std::string&>(), py::arg("config_json"),
           py::arg("device"), py::arg("resume_dir"))
      .def("shape", &Trainer::shape)
      .def("step", &Trainer::step, py::arg("tokens"), py::arg("targets"))
      .def("steps_done", &Trainer::steps_done)
      .def("save", &Trainer::save)
      .def("load", &Trainer::load)
      .def("finalize", &Trainer::finalize)
      .def("abort", &Trainer::abort)
      .def("describe", &Trainer::describe)
      .def("close", &Trainer::close);
  m.def("plan", &plan, py::arg("config_json"), py::arg("device"));
  m.def("library_version", [] {
    int major = 0, minor = 0, patch = 0;
    strata_get_version(&major, &minor, &patch);
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  });
}

}  // namespace strata::python
