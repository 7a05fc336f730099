#include "spyglass/status.h"

namespace spyglass {

std::string Status::ToString() const {
  const char* name = "OK";
  switch (code_) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: name = "InvalidArgument"; break;
    case StatusCode::kFailedPrecondition: name = "FailedPrecondition"; break;
    case StatusCode::kAlreadyExists: name = "AlreadyExists"; break;
    case StatusCode::kNotFound: name = "NotFound"; break;
    case StatusCode::kUnavailable: name = "Unavailable"; break;
    case StatusCode::kDeadlineExceeded: name = "DeadlineExceeded"; break;
    case StatusCode::kCancelled: name = "Cancelled"; break;
    case StatusCode::kInternal: name = "Internal"; break;
  }
  return std::string(name) + ": " + message_;
}

}  // namespace spyglass
