// strata.Trainer and strata.plan's native half (trainer.cpp): registers
// Trainer, plan and library_version on the module.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace strata::python {

void add_trainer(pybind11::module_& m);

}  // namespace strata::python
