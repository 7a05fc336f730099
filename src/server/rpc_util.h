// Small helpers shared by the profiler service, its client and the
// subprocess tracer: status conversion, channels, address checks.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <climits>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "spyglass/status.h"

namespace spyglass::server {

inline grpc::Status ToGrpc(const Status& s) {
  grpc::StatusCode c = grpc::StatusCode::INTERNAL;
  switch (s.code()) {
    case StatusCode::kOk: return grpc::Status::OK;
    case StatusCode::kInvalidArgument: c = grpc::StatusCode::INVALID_ARGUMENT; break;
    case StatusCode::kFailedPrecondition: c = grpc::StatusCode::FAILED_PRECONDITION; break;
    case StatusCode::kAlreadyExists: c = grpc::StatusCode::ALREADY_EXISTS; break;
    case StatusCode::kNotFound: c = grpc::StatusCode::NOT_FOUND; break;
    case StatusCode::kUnavailable: c = grpc::StatusCode::UNAVAILABLE; break;
    case StatusCode::kDeadlineExceeded: c = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case StatusCode::kCancelled: c = grpc::StatusCode::CANCELLED; break;
    case StatusCode::kInternal: c = grpc::StatusCode::INTERNAL; break;
  }
  return grpc::Status(c, s.message());
}

// A gRPC failure of a call to `address`, as a Status with a message that
// says what probably happened.
inline Status FromGrpc(const grpc::Status& g, const std::string& address) {
  std::string m = g.error_message();
  switch (g.error_code()) {
    case grpc::StatusCode::OK: return Status::Ok();
    case grpc::StatusCode::UNIMPLEMENTED:
      return UnavailableError(address + " does not provide the profiler service (tensorflow.ProfilerService): " + m);
    case grpc::StatusCode::UNAVAILABLE:
      return UnavailableError("cannot reach a profiler server at " + address + ": " + m);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return DeadlineExceededError("the profiler server at " + address + " did not answer in time: " + m);
    case grpc::StatusCode::INVALID_ARGUMENT: return InvalidArgumentError(address + ": " + m);
    case grpc::StatusCode::FAILED_PRECONDITION: return FailedPreconditionError(address + ": " + m);
    case grpc::StatusCode::ALREADY_EXISTS: return AlreadyExistsError(address + ": " + m);
    case grpc::StatusCode::CANCELLED: return CancelledError(address + ": " + m);
    case grpc::StatusCode::NOT_FOUND: return NotFoundError(address + ": " + m);
    default: return InternalError(address + ": " + m + " (gRPC code " + std::to_string(g.error_code()) + ")");
  }
}

// gRPC cannot run in a process forked after the parent used it (its threads
// and pollers do not survive fork; its fork support hangs here). We note the
// first use, and a forked child then gets a clear error instead of a server
// that never answers.
void NoteGrpcUsed();
// Non-OK in a child forked after this process (or an ancestor) used gRPC.
Status CheckGrpcUsable();

// A channel that accepts replies up to `max_receive_bytes` (gRPC enforces it
// and fails the call with RESOURCE_EXHAUSTED).
inline std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, int max_receive_bytes = INT_MAX) {
  NoteGrpcUsed();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_receive_bytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

inline std::chrono::system_clock::time_point AfterMs(int64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

// One unary call of `method` with the serialized `request`, waited for; the
// reply stays bytes (a generated message tree costs many times its wire
// size). `ctx` carries the deadline.
inline grpc::Status RawUnaryCall(grpc::ClientContext* ctx, const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& method, const std::string& request, grpc::ByteBuffer* reply) {
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1);
  grpc::GenericStub stub(channel);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status g;
  stub.UnaryCall(ctx, method, grpc::StubOptions(), &req, reply, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    g = std::move(s);
    done = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  return g;
}

// "host:port" with a non-empty host without '/' and a port 1..65535
// ("[v6]:port" accepted too).
inline Status CheckAddress(const std::string& address) {
  size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  std::string port = colon == std::string::npos ? "" : address.substr(colon + 1);
  bool ok = !host.empty() && host.find('/') == std::string::npos && !port.empty() && port.size() <= 5 &&
            port.find_first_not_of("0123456789") == std::string::npos;
  if (ok) {
    int p = std::stoi(port);
    ok = p >= 1 && p <= 65535;
  }
  if (ok && host.find(':') != std::string::npos) ok = host.front() == '[' && host.back() == ']';
  if (!ok) return InvalidArgumentError("could not interpret \"" + address + "\" as host:port");
  return Status::Ok();
}

}  // namespace spyglass::server
