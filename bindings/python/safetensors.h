// strata.safetensors' native half (safetensors.cpp): registers
// export_checkpoint and read_safetensors on the module.
#pragma once

#include <pybind11/pybind11.h>

namespace strata::python {

void add_safetensors(pybind11::module_& m);

}  // namespace strata::python
