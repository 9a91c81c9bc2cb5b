// A strata_status as a Python exception: the builtin class of its kind
// (ValueError for INVALID_ARGUMENT, FileNotFoundError for NOT_FOUND,
// MemoryError for RESOURCE_EXHAUSTED, NotImplementedError for
// UNIMPLEMENTED, RuntimeError for FAILED_PRECONDITION and CANCELLED,
// OSError otherwise) carrying strata_last_error()'s message and, as its
// `status` attribute, the status's name ("INVALID_ARGUMENT", ...). Call
// with the GIL held.
#pragma once

#include "strata/strata.h"

namespace strata::python {

[[noreturn]] void raise_status(strata_status s);
inline void check_status(strata_status s) {
  if (s != STRATA_OK) raise_status(s);
}

}  // namespace strata::python
