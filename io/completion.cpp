#include "io/completion.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "common/units.h"

namespace strata::io {
namespace {

Decision fail(StatusCode code, int err, std::string reason) { return {NextAction::kFail, code, err, std::move(reason)}; }

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (" + errno_name(err) + ")"; }

Decision retry_or_fail(uint32_t& counter, uint32_t limit, int err, StatusCode final_code, const char* what) {
  if (counter < limit) {
    ++counter;
    return {NextAction::kRetry, StatusCode::kOk, err, {}};
  }
  return fail(final_code, err, std::string(what) + " persisted after " + std::to_string(limit) + " retries");
}

Decision decide_success(RequestProgress& p, uint64_t bytes, const RetryPolicy& policy) {
  uint64_t remaining = p.length_bytes - p.done_bytes;
  if (bytes > remaining) {
    return fail(StatusCode::kInternal, 0,
                "device reported " + std::to_string(bytes) + " bytes for a request of " + std::to_string(remaining));
  }
  p.done_bytes += bytes;
  if (bytes > 0) {
    // Retry limits count failures in a row at one position: a request that
    // moves forward has shown the device works, so a long request split by
    // short transfers does not pile up unrelated transient errors.
    p.eio_retries = 0;
    p.transient_retries = 0;
  }
  if (p.done_bytes == p.length_bytes) return {NextAction::kComplete, StatusCode::kOk, 0, {}};
  if (bytes == 0) {
    if (p.op == IoOp::kRead) {
      return fail(StatusCode::kDataLoss, 0,
                  "short read: end of file after " + std::to_string(p.done_bytes) + " of " +
                      std::to_string(p.length_bytes) + " bytes");
    }
    return retry_or_fail(p.transient_retries, policy.max_transient_retries, 0, StatusCode::kResourceExhausted,
                         "zero-length write (device full?)");
  }
  if (!is_aligned(p.done_bytes, p.alignment)) {
    return fail(StatusCode::kDataLoss, 0,
                "short " + std::string(io_op_name(p.op)) + " of " + std::to_string(bytes) +
                    " bytes leaves the remainder misaligned for direct I/O (alignment " +
                    std::to_string(p.alignment) + ")");
  }
  if (p.partial_resubmits >= policy.max_partial_resubmits) {
    return fail(StatusCode::kUnavailable, 0,
                "still short after " + std::to_string(policy.max_partial_resubmits) + " resubmissions");
  }
  ++p.partial_resubmits;
  return {NextAction::kResubmitRemainder, StatusCode::kOk, 0, {}};
}

}  // namespace

Decision decide_completion(RequestProgress& p, int64_t res, const RetryPolicy& policy) {
  if (res >= 0) return decide_success(p, static_cast<uint64_t>(res), policy);
  int err = static_cast<int>(-res);
  STRATA_CHECK_MSG(err != EFAULT, "I/O request with a bad buffer address (EFAULT)");
  switch (err) {
    case EINTR:
    case EAGAIN:
      return retry_or_fail(p.transient_retries, policy.max_transient_retries, err, StatusCode::kUnavailable,
                           errno_name(err).c_str());
    case EIO:
      return retry_or_fail(p.eio_retries, policy.max_eio_retries, err, StatusCode::kUnavailable,
                           "I/O error (EIO)");
    case EINVAL:
      return fail(StatusCode::kInvalidArgument, err,
                  errno_text(err) + ": misaligned buffer, offset or length for direct I/O?");
    case ECANCELED:
      return fail(StatusCode::kCancelled, err, errno_text(err));
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      if (p.op == IoOp::kWrite) return fail(StatusCode::kResourceExhausted, err, errno_text(err));
      return fail(StatusCode::kInternal, err, "unexpected on read: " + errno_text(err));
    case EBADF:
      return fail(StatusCode::kInternal, err, errno_text(err) + ": file not open for this operation?");
    default:
      return fail(StatusCode::kInternal, err, errno_text(err));
  }
}

}  // namespace strata::io
