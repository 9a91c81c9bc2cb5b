// strata.Session's native half (session.cpp): registers _strata.Session.
#pragma once

#include <pybind11/pybind11.h>

namespace strata::python {

void add_session(pybind11::module_& m);

}  // namespace strata::python
