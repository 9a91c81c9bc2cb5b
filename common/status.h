// Status and Result<T>: how strata reports operating errors (EIO, ENOSPC, bad
// input, exhausted budgets) as values. Programmer errors use STRATA_CHECK
// (check.h) instead. Codes are a small closed set with abseil's meanings; a
// Status also carries a `retryable` bit (set for transient conditions such as
// EAGAIN) and a message that each layer extends with context.
// Result<T> is shaped like C++23 std::expected<T, Status> so it can be swapped
// for it later: has_value(), operator bool, value(), operator*, error().
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "common/check.h"

namespace strata {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,     // bad input from the caller; retrying won't help
  kNotFound = 2,            // a named thing (file, directory, blob) does not exist
  kFailedPrecondition = 3,  // system not in a state for the call (permissions, in-flight op)
  kResourceExhausted = 4,   // a budget, queue or disk is full
  kUnavailable = 5,         // the device failed (EIO) or is busy (EAGAIN)
  kDataLoss = 6,            // data read back is not what was written (checksum, short read)
  kCancelled = 7,           // the operation was cancelled (shutdown, abort)
  kUnimplemented = 8,       // not supported on this system or backend
  kInternal = 9,            // an unexpected error; message has the details
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message, bool retryable = false);

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;
  ~Status() = default;

  static Status ok_status() { return Status(); }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  bool retryable() const { return state_ ? state_->retryable : false; }
  std::string_view message() const;
  // "CODE: message", or "OK".
  std::string to_string() const;

  // Returns this status with "context: " prefixed to its message (no-op on OK).
  Status with_context(std::string_view context) const&;
  Status with_context(std::string_view context) &&;

  // Marks the error as never worth retrying (used when retries are exhausted).
  Status final_error() &&;

  // Explicitly drops the status; for cleanup paths that already logged it.
  void ignore() const {}

 private:
  struct State {
    StatusCode code;
    bool retryable;
    std::string message;
  };
  std::unique_ptr<State> state_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
inline Status not_found(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status failed_precondition(std::string m) { return Status(StatusCode::kFailedPrecondition, std::move(m)); }
inline Status resource_exhausted(std::string m) { return Status(StatusCode::kResourceExhausted, std::move(m)); }
inline Status unavailable(std::string m, bool retryable = false) {
  return Status(StatusCode::kUnavailable, std::move(m), retryable);
}
inline Status data_loss(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
inline Status cancelled(std::string m) { return Status(StatusCode::kCancelled, std::move(m)); }
inline Status unimplemented(std::string m) { return Status(StatusCode::kUnimplemented, std::move(m)); }
inline Status internal_error(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

// Maps an errno value to a Status: ENOSPC -> ResourceExhausted, ENOENT ->
// NotFound, EAGAIN/EINTR -> Unavailable (retryable), EIO -> Unavailable, ...
// The message is "what: strerror (ENAME)".
Status errno_status(int err, std::string_view what);
// "EIO", "ENOSPC", ... or "errno N".
std::string errno_name(int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit like std::expected
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    STRATA_CHECK_MSG(!status_.ok(), "Result constructed from an OK status without a value");
  }

  bool has_value() const { return value_.has_value(); }
  explicit operator bool() const { return has_value(); }

  T& value() & { check_value(); return *value_; }
  const T& value() const& { check_value(); return *value_; }
  T&& value() && { check_value(); return std::move(*value_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Status& error() const& { return status_; }
  Status error() && { return std::move(status_); }
  // OK when a value is held.
  const Status& status() const { return status_; }

 private:
  void check_value() const {
    STRATA_CHECK_MSG(value_.has_value(), "Result::value() on an error: %s", status_.to_string().c_str());
  }
  std::optional<T> value_;
  Status status_;
};

}  // namespace strata

#define STRATA_CONCAT_INNER_(a, b) a##b
#define STRATA_CONCAT_(a, b) STRATA_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define STRATA_RETURN_IF_ERROR(expr)                       \
  do {                                                     \
    ::strata::Status strata_status_ = (expr);              \
    if (!strata_status_.ok()) return strata_status_;       \
  } while (0)

// Like STRATA_RETURN_IF_ERROR, prefixing `context` (a string expression) on error.
#define STRATA_RETURN_IF_ERROR_CTX(expr, context)                                  \
  do {                                                                             \
    ::strata::Status strata_status_ = (expr);                                      \
    if (!strata_status_.ok()) return std::move(strata_status_).with_context(context); \
  } while (0)

// `lhs = value of expr`, or return its error.
#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_CONCAT_(strata_result_, __LINE__), lhs, expr)
#define STRATA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.has_value()) return std::move(tmp).error(); \
  lhs = std::move(tmp).value()
