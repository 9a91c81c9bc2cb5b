// Status implementation and the errno -> StatusCode table shared by every layer.
#include "common/status.h"

#include <cerrno>
#include <cstring>

namespace strata {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string message, bool retryable) {
  STRATA_CHECK_MSG(code != StatusCode::kOk, "an OK Status carries no message");
  state_ = std::make_unique<State>(State{code, retryable, std::move(message)});
}

Status::Status(const Status& other)
    : state_(other.state_ ? std::make_unique<State>(*other.state_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) state_ = other.state_ ? std::make_unique<State>(*other.state_) : nullptr;
  return *this;
}

std::string_view Status::message() const { return state_ ? std::string_view(state_->message) : ""; }

std::string Status::to_string() const {
  if (ok()) return "OK";
  std::string out(status_code_name(code()));
  out += ": ";
  out += state_->message;
  return out;
}

Status Status::with_context(std::string_view context) const& {
  Status copy(*this);
  return std::move(copy).with_context(context);
}

Status Status::with_context(std::string_view context) && {
  if (state_ && !context.empty()) {
    std::string message(context);
    message += ": ";
    message += state_->message;
    state_->message = std::move(message);
  }
  return std::move(*this);
}

Status Status::final_error() && {
  if (state_) state_->retryable = false;
  return std::move(*this);
}

std::string errno_name(int err) {
  switch (err) {
    case EIO: return "EIO";
    case ENOSPC: return "ENOSPC";
    case EDQUOT: return "EDQUOT";
    case EAGAIN: return "EAGAIN";
    case EINTR: return "EINTR";
    case EINVAL: return "EINVAL";
    case ENOENT: return "ENOENT";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case EROFS: return "EROFS";
    case EBADF: return "EBADF";
    case EFAULT: return "EFAULT";
    case ENOMEM: return "ENOMEM";
    case ECANCELED: return "ECANCELED";
    case ENOTDIR: return "ENOTDIR";
    case EISDIR: return "EISDIR";
    case EEXIST: return "EEXIST";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case ENOSYS: return "ENOSYS";
    case EFBIG: return "EFBIG";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    case EBUSY: return "EBUSY";
    default: return "errno " + std::to_string(err);
  }
}

Status errno_status(int err, std::string_view what) {
  std::string message(what);
  message += ": ";
  message += std::strerror(err);
  message += " (" + errno_name(err) + ")";
  switch (err) {
    case EAGAIN:
    case EINTR:
    case EBUSY:
      return Status(StatusCode::kUnavailable, std::move(message), /*retryable=*/true);
    case EIO:
      return Status(StatusCode::kUnavailable, std::move(message));
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EFBIG:
      return Status(StatusCode::kResourceExhausted, std::move(message));
    case ENOENT:
      return Status(StatusCode::kNotFound, std::move(message));
    case EACCES:
    case EPERM:
    case EROFS:
    case ENOTDIR:
    case EISDIR:
    case EEXIST:
      return Status(StatusCode::kFailedPrecondition, std::move(message));
    case EINVAL:
      return Status(StatusCode::kInvalidArgument, std::move(message));
    case EOPNOTSUPP:
    case ENOSYS:
      return Status(StatusCode::kUnimplemented, std::move(message));
    case ECANCELED:
      return Status(StatusCode::kCancelled, std::move(message));
    default:
      return Status(StatusCode::kInternal, std::move(message));
  }
}

}  // namespace strata
