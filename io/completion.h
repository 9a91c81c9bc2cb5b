// How one raw completion moves a request forward: a pure function from
// (request progress, kernel result) to the next action, so the whole errno
// table is unit-tested without a kernel.
//
// Per operation kind:
//   res == remaining           -> complete
//   0 < res < remaining        -> resubmit the remainder (must stay aligned under O_DIRECT)
//   res == 0, read             -> fail DataLoss: short read (the file ends early)
//   res == 0, write            -> retry (bounded), then fail ResourceExhausted
//   -EINTR, -EAGAIN            -> retry (bounded), then fail Unavailable
//   -EIO                       -> retry (bounded, transient media errors), then fail Unavailable
//   -ENOSPC, -EDQUOT (write)   -> fail ResourceExhausted
//   -EINVAL                    -> fail InvalidArgument (misaligned direct I/O)
//   -ECANCELED                 -> fail Cancelled
//   -EFAULT                    -> programmer error: STRATA_CHECK
//   anything else              -> fail Internal with the errno text
#pragma once

#include <cstdint>

#include "common/status.h"
#include "io/block_device.h"

namespace strata::io {

// Limits on failures in a row at one position of a request; progress resets them.
struct RetryPolicy {
  uint32_t max_transient_retries = 16;  // EINTR / EAGAIN / zero-length writes
  uint32_t max_eio_retries = 3;         // EIO
  uint32_t max_partial_resubmits = 64;  // short transfers in one request
};

struct RequestProgress {
  IoOp op = IoOp::kRead;
  uint64_t length_bytes = 0;  // whole request
  uint64_t done_bytes = 0;    // transferred so far
  uint64_t alignment = 1;     // resubmitted offsets must keep this alignment
  uint32_t transient_retries = 0;
  uint32_t eio_retries = 0;
  uint32_t partial_resubmits = 0;
};

enum class NextAction { kComplete, kResubmitRemainder, kRetry, kFail };

struct Decision {
  NextAction action = NextAction::kComplete;
  StatusCode code = StatusCode::kOk;  // for kFail
  int err = 0;                        // errno behind the decision, 0 if none
  std::string reason;                 // for kFail: what went wrong, without file/offset
};

// Updates `progress` (done bytes, retry counters) and says what to do next.
Decision decide_completion(RequestProgress& progress, int64_t res, const RetryPolicy& policy);

}  // namespace strata::io
