// strata.aio's native half (aio.cpp): registers AioHandle and
// aligned_buffer on the module.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

namespace strata::python {

void add_aio(pybind11::module_& m);

}  // namespace strata::python
