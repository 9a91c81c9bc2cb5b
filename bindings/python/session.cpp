// _strata.Session: the C API's session (strata/session.h) for Python, as a
// trainer in C drives it; strata/session.py builds strata.Session on it.
// Chunk memory is handed over as an address: the Python side, which
// knows each chunk's count and type, wraps it without copying in views
// valid until the release or submit that ends them. Every failure raises the exception of its
// strata_status (status.h), changing nothing; the GIL is released while
// strata works.
#include "bindings/python/session.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings/python/status.h"
#include "strata/strata.h"

namespace py = pybind11;

namespace strata::python {
namespace {

class Session {
 public:
  Session(const std::string& config_json, const std::string& device) {
    strata_status s;
    {
      py::gil_scoped_release unlocked;
      s = strata_session_create(config_json.c_str(), device.c_str(), &s_);
    }
    check_status(s);
  }
  ~Session() { close(); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void close() {
    if (s_ == nullptr) return;
    py::gil_scoped_release unlocked;
    strata_session_destroy(s_);
    s_ = nullptr;
  }

  // `initial`: the chunk's fp32 values (its element count), or None with `count` for zeros.
  int64_t add_chunk(const std::string& name, int64_t count,
                    const std::optional<py::array_t<float, py::array::c_style | py::array::forcecast>>& initial) {
    const float* values = nullptr;
    if (initial) {
      if (initial->size() != count) {
        throw py::value_error("add_chunk " + name + ": " + std::to_string(initial->size()) +
                              " initial values for a chunk of " + std::to_string(count));
      }
      values = initial->data();
    }
    int64_t chunk = -1;
    check_status(strata_session_add_chunk(live(), name.c_str(), count, values, &chunk));
    return chunk;
  }
  void set_chunk_dtype(int64_t chunk, const std::string& dtype) {
    check_status(strata_session_set_chunk_dtype(live(), chunk, dtype.c_str()));
  }
  std::string chunk_dtype(int64_t chunk) const {
    const char* d = nullptr;
    check_status(strata_session_chunk_dtype(live(), chunk, &d));
    return d;
  }
  void add_tensor(int64_t chunk, const std::string& name, int64_t offset, const std::vector<int64_t>& shape) {
    check_status(strata_session_add_tensor(live(), chunk, name.c_str(), offset, shape.data(),
                                           static_cast<int>(shape.size())));
  }
  void start() { blocking([&] { return strata_session_start(live()); }); }
  void set_lr(double lr) { check_status(strata_session_set_lr(live(), lr)); }
  void set_gradient_order(const std::vector<int64_t>& order) {
    check_status(strata_session_set_gradient_order(live(), order.data(), static_cast<int64_t>(order.size())));
  }
  double loss_scale() const { return strata_session_loss_scale(live()); }
  void set_loss_scale(double scale) { check_status(strata_session_set_loss_scale(live(), scale)); }
  void begin_step(float grad_scale) { blocking([&] { return strata_session_begin_step(live(), grad_scale); }); }

  // The address of the chunk's working weights, until release.
  uintptr_t acquire(int64_t chunk) {
    const void* w = nullptr;
    blocking([&] { return strata_session_acquire(live(), chunk, nullptr, &w); });
    return reinterpret_cast<uintptr_t>(w);
  }
  void release(int64_t chunk) { blocking([&] { return strata_session_release(live(), chunk); }); }
  uintptr_t gradient_buffer(int64_t chunk) {
    void* g = nullptr;
    blocking([&] { return strata_session_gradient_buffer(live(), chunk, &g); });
    return reinterpret_cast<uintptr_t>(g);
  }
  void submit_gradient(int64_t chunk) {
    blocking([&] { return strata_session_submit_gradient(live(), chunk, nullptr); });
  }
  py::dict end_step() {
    strata_step_verdict v = STRATA_STEP_VERDICT_INIT;
    blocking([&] { return strata_session_end_step(live(), &v); });
    py::dict d;
    d["step"] = v.step;
    d["grad_norm"] = v.grad_norm;
    d["clipped"] = v.clipped != 0;
    d["skipped"] = v.skipped != 0;
    d["rolled_back"] = v.rolled_back != 0;
    d["lr"] = v.lr;
    d["loss_scale"] = v.loss_scale;
    return d;
  }
  void cancel_step() { blocking([&] { return strata_session_cancel_step(live()); }); }
  // `count`: the chunk's element count (a wrong one is refused).
  py::array_t<float> read_master(int64_t chunk, int64_t count) {
    const int64_t n = count;
    if (n < 1) throw py::value_error("read_master: count must be >= 1");
    py::array_t<float> out(static_cast<py::ssize_t>(n));
    float* dst = out.mutable_data();
    blocking([&] { return strata_session_read_master(live(), chunk, dst, n); });
    return out;
  }
  int64_t steps_done() const { return strata_session_steps_done(live()); }
  void save(const std::string& dir) { blocking([&] { return strata_session_save(live(), dir.c_str()); }); }
  void load(const std::string& dir) { blocking([&] { return strata_session_load(live(), dir.c_str()); }); }
  std::string describe() {
    const char* text = strata_session_describe(live());
    return text == nullptr ? std::string("{}") : std::string(text);
  }
  void finalize() { blocking([&] { return strata_session_finalize(live()); }); }
  void abort() { check_status(strata_session_abort(live())); }

 private:
  strata_session* live() const {
    if (s_ == nullptr) throw std::runtime_error("strata.Session: used after close()");
    return s_;
  }
  // Runs a C call with the GIL released and raises its failure with it held.
  template <class F>
  void blocking(F&& call) {
    live();  // closed: raised here, with the GIL
    strata_status st;
    {
      py::gil_scoped_release unlocked;
      st = call();
    }
    check_status(st);
  }

  strata_session* s_ = nullptr;
};

}  // namespace

void add_session(py::module_& m) {
  py::class_<Session>(m, "Session")
      .def(py::init<const std::string&, const std::string&>(), py::arg("config_json"), py::arg("device"))
      .def("close", &Session::close)
      .def("add_chunk", &Session::add_chunk, py::arg("name"), py::arg("count"), py::arg("initial"))
      .def("set_chunk_dtype", &Session::set_chunk_dtype)
      .def("chunk_dtype", &Session::chunk_dtype)
      .def("add_tensor", &Session::add_tensor)
      .def("start", &Session::start)
      .def("set_lr", &Session::set_lr)
      .def("set_gradient_order", &Session::set_gradient_order)
      .def("loss_scale", &Session::loss_scale)
      .def("set_loss_scale", &Session::set_loss_scale)
      .def("begin_step", &Session::begin_step)
      .def("acquire", &Session::acquire)
      .def("release", &Session::release)
      .def("gradient_buffer", &Session::gradient_buffer)
      .def("submit_gradient", &Session::submit_gradient)
      .def("end_step", &Session::end_step)
      .def("cancel_step", &Session::cancel_step)
      .def("read_master", &Session::read_master)
      .def("steps_done", &Session::steps_done)
      .def("save", &Session::save)
      .def("load", &Session::load)
      .def("describe", &Session::describe)
      .def("finalize", &Session::finalize)
      .def("abort", &Session::abort);
}

}  // namespace strata::python
