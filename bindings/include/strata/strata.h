/*
 * strata.h: the C API of strata, for trainers that link it without C++ or
 * Python (libstrata.so). Three headers, all included here:
 *   strata/core.h     the release and its checks, status codes, errors
 *   strata/trainer.h  the built-in GPT's trainer, from a JSON config
 *   strata/session.h  the session: a model of the caller's own
 * docs/C_API.md is the reference, a page per header.
 */
#ifndef STRATA_STRATA_H_
#define STRATA_STRATA_H_

#include "strata/core.h"
#include "strata/session.h"
#include "strata/trainer.h"

#endif /* STRATA_STRATA_H_ */
