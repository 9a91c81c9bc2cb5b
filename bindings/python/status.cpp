#include "bindings/python/status.h"

#include <pybind11/pybind11.h>

#include <cerrno>
#include <string>

namespace py = pybind11;

namespace strata::python {

void raise_status(strata_status s) {
  const std::string last = strata_last_error();  // "CODE: message"
  const std::string m = last.empty() ? std::string(strata_status_name(s)) : last;
  PyObject* type = PyExc_OSError;
  py::tuple args = py::make_tuple(m);
  switch (s) {
    case STRATA_INVALID_ARGUMENT: type = PyExc_ValueError; break;
    case STRATA_NOT_FOUND:
      type = PyExc_FileNotFoundError;
      args = py::make_tuple(ENOENT, m);
      break;
    case STRATA_FAILED_PRECONDITION:
    case STRATA_CANCELLED: type = PyExc_RuntimeError; break;
    case STRATA_RESOURCE_EXHAUSTED: type = PyExc_MemoryError; break;
    case STRATA_UNIMPLEMENTED: type = PyExc_NotImplementedError; break;
    default: args = py::make_tuple(EIO, m);
  }
  py::object error = py::reinterpret_borrow<py::object>(type)(*args);
  error.attr("status") = strata_status_name(s);
  PyErr_SetObject(type, error.ptr());
  throw py::error_already_set();
}

}  // namespace strata::python
