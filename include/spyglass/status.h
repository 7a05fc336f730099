// Errors as values. Every fallible call of the library returns a Status;
// the Python binding turns them into exceptions at the language boundary.
#pragma once

#include <string>
#include <utility>

namespace spyglass {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // bad option key/value, bad path from a request
  kFailedPrecondition, // a trace already running, stop without start
  kAlreadyExists,
  kNotFound,
  kUnavailable,        // a peer or port cannot be reached
  kDeadlineExceeded,
  kCancelled,
  kInternal,           // I/O failure, unexpected state
};

// "InvalidArgument", "FailedPrecondition", ... ("OK" for kOk).
const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: unknown advanced_configuration key 'x'".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgumentError(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status FailedPreconditionError(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status CancelledError(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status AlreadyExistsError(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status DeadlineExceededError(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }

}  // namespace spyglass
