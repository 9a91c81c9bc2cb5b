/*
 * strata/core.h: what every part of strata's C API shares — the export
 * macro, the release and its checks, status codes and the per-thread error
 * message. Included by strata/trainer.h and strata/session.h; a program
 * includes <strata/strata.h>, which has them all.
 *
 * Errors: every call that can fail returns a strata_status; on failure,
 * strata_last_error() gives the message (per thread, valid until the next
 * strata call on that thread). A failed call changes nothing the caller can
 * see: a failed create leaves *out NULL, a refused step leaves the trainer
 * or session where it was.
 */
#ifndef STRATA_CORE_H_
#define STRATA_CORE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif


#if defined(__GNUC__)
#define STRATA_API __attribute__((visibility("default")))
#else
#define STRATA_API
#endif

/*
 * Versions: one scheme, strata's release. Within a major version the
 * library only adds: functions (each release's new symbols in a version
 * node of their own, STRATA_1.0, STRATA_1.1, ...) and fields at the end of
 * a struct. A program built against 1.N runs with any 1.M library, M >= N:
 * check at compile time with STRATA_VERSION_AT_LEAST, at run time with
 * STRATA_CHECK_VERSION() (strata_check_version).
 *
 * Structs: every struct that crosses the boundary begins with struct_size,
 * which the caller sets to sizeof the struct as its header declares it —
 * the STRATA_*_INIT initialisers do, and zero the rest. The library reads
 * and writes only the bytes that struct_size covers: a field a caller's
 * older header does not have reads as zero (its default) and is never
 * written; a caller's newer struct has its later fields left untouched,
 * and on input they must be zero (INVALID_ARGUMENT otherwise: a feature
 * this library does not have).
 */
#define STRATA_VERSION_MAJOR 1
#define STRATA_VERSION_MINOR 0
#define STRATA_VERSION_PATCH 0
#define STRATA_VERSION_NUMBER (STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH)
/* 1 when this header is release major.minor.patch or a later one. */
#define STRATA_VERSION_AT_LEAST(major, minor, patch) \
  (STRATA_VERSION_NUMBER >= (major) * 10000 + (minor) * 100 + (patch))

typedef enum strata_status {
  STRATA_OK = 0,
  STRATA_INVALID_ARGUMENT = 1,    /* bad input from the caller; retrying won't help */
  STRATA_NOT_FOUND = 2,           /* a named file or directory does not exist */
  STRATA_FAILED_PRECONDITION = 3, /* not in a state for the call (permissions, a broken trainer) */
  STRATA_RESOURCE_EXHAUSTED = 4,  /* a budget, memory or disk is full; nothing fits */
  STRATA_UNAVAILABLE = 5,         /* a device failed (EIO) or is busy */
  STRATA_DATA_LOSS = 6,           /* data read back is not what was written */
  STRATA_CANCELLED = 7,
  STRATA_UNIMPLEMENTED = 8, /* not supported here (a CUDA trainer without a GPU, say) */
  STRATA_INTERNAL = 9
} strata_status;

#define STRATA_SHAPE_INIT {sizeof(strata_shape), 0, 0, 0, 0}

/* The loaded library's release into *major, *minor, *patch (each optional,
 * NULL to skip). Never fails; any thread; does not block. */
STRATA_API void strata_get_version(int* major, int* minor, int* patch);
/* STRATA_OK when the loaded library serves a program built against release
 * major.minor (the same major, a minor as new or newer);
 * STRATA_FAILED_PRECONDITION otherwise, strata_last_error() naming both
 * releases. Any thread; does not block. */
STRATA_API strata_status strata_check_version(int major, int minor);
/* strata_check_version of the header the caller was built against. */
#define STRATA_CHECK_VERSION() strata_check_version(STRATA_VERSION_MAJOR, STRATA_VERSION_MINOR)
/* The message of this thread's last failure ("" if none). */
STRATA_API const char* strata_last_error(void);
/* "OK", "INVALID_ARGUMENT", ... */
STRATA_API const char* strata_status_name(strata_status status);

#ifdef __cplusplus
}
#endif

#endif /* STRATA_CORE_H_ */
