#include "server/service.h"

#include <pthread.h>

#include <atomic>

#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <thread>

#include "export/log_dir.h"
#include "export/xplane/xplane_writer.h"
#include "server/options_convert.h"
#include "server/path_policy.h"
#include "server/rpc_util.h"
#include "session/session.h"
#include "trace/clock.h"

namespace spyglass::server {
namespace {

constexpr uint64_t kUntilTerminate = std::numeric_limits<uint64_t>::max();
constexpr char kBusy[] =
    "already profiling: another profiling session (a remote capture or start_trace) is running in this process; "
    "try again when it has finished";

}  // namespace

bool ProfilerServiceImpl::TakeTerminate(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return terminated_.erase(session_id) > 0;
}

grpc::Status ProfilerServiceImpl::Terminate(grpc::ServerContext*, const tensorflow::TerminateRequest* req,
                                            tensorflow::TerminateResponse*) {
  std::lock_guard<std::mutex> lock(mu_);
  if (terminated_.size() >= 1024) terminated_.clear();  // bounded: stale ids of calls that never came
  terminated_.insert(req->session_id());
  return grpc::Status::OK;
}

grpc::Status ProfilerServiceImpl::Monitor(grpc::ServerContext*, const tensorflow::MonitorRequest*,
                                          tensorflow::MonitorResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "unimplemented.");
}

grpc::Status ProfilerServiceImpl::Profile(grpc::ServerContext* ctx, const tensorflow::ProfileRequest* req,
                                          tensorflow::ProfileResponse* resp) {
  if (shutting_down_.load()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the profiler server is stopping");
  profiler::ProfileOptions options = FromProto(req->opts());
  // The session's duration: opts.duration_ms as the reference server, else the request's.
  uint64_t duration_ms = options.duration_ms != 0 ? options.duration_ms : req->duration_ms();
  if (duration_ms == 0)
    return ToGrpc(InvalidArgumentError("duration_ms must be greater than 0 (got 0)"));
  if (duration_ms != kUntilTerminate && duration_ms > options_.max_duration_ms)
    return ToGrpc(InvalidArgumentError("duration_ms " + std::to_string(duration_ms) + " is over this server's limit of " +
                                       std::to_string(options_.max_duration_ms) +
                                       " ms (ServerOptions::max_duration_ms)"));
  uint64_t now_ns = internal::wall_ns();
  if (options.start_timestamp_ns > now_ns + options_.max_duration_ms * 1000000ull)
    return ToGrpc(InvalidArgumentError("start_timestamp_ns is too far in the future"));
  // session_id: the run directory; the request's, else the options', else a timestamp.
  std::string session_id = !req->session_id().empty() ? req->session_id() : options.session_id;
  if (session_id.empty()) session_id = exporter::TimestampRunName();
  options.session_id.clear();  // not a directory of this process: the request says where to write

  ProfileTarget target;
  if (!req->emit_xspace()) {
    std::string host = req->host_name();
    auto o = options.advanced_configuration.find("override_hostname");
    if (o != options.advanced_configuration.end() && o->second.is_string() && !o->second.as_string().empty())
      host = o->second.as_string();
    if (host.empty()) host = session::Hostname();
    if (Status s = ResolveProfileFile(req->repository_root(), session_id, host, options_.allowed_log_root, &target);
        !s.ok())
      return ToGrpc(s);
  }

  std::unique_ptr<session::Session> session;
  if (Status s = session::Session::Create(options, kBusy, &session); !s.ok()) return ToGrpc(s);

  // Record until the duration passed, Terminate(session_id), the client left
  // or the server stops.
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(
                                                    duration_ms == kUntilTerminate ? int64_t{1} << 40 : duration_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (ctx->IsCancelled()) {
      session.reset();  // stops and discards
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away; the capture was stopped");
    }
    if (shutting_down_.load()) {
      session.reset();
      return grpc::Status(grpc::StatusCode::CANCELLED, "the profiler server is stopping; the capture was stopped");
    }
    if (TakeTerminate(session_id)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }

  model::Space space;
  session::SessionSummary summary;
  Status collect = session->Stop(&space, &summary);
  session.reset();
  if (!collect.ok()) std::fprintf(stderr, "spyglass server: %s\n", collect.ToString().c_str());
  resp->set_empty_trace(space.event_count() == 0);

  std::string bytes = exporter::SerializeXSpace(space);
  if (req->emit_xspace()) {
    if (!resp->mutable_xspace()->ParseFromString(bytes))
      return ToGrpc(InternalError("could not build the XSpace reply"));
    return grpc::Status::OK;
  }
  if (Status s = WriteProfileFile(target, bytes); !s.ok()) return ToGrpc(s);
  return grpc::Status::OK;
}

// ---- start_server / stop_server ----------------------------------------------

namespace {

struct ServerState {
  std::mutex mu;
  std::unique_ptr<ProfilerServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

ServerState& state() {
  static auto* s = new ServerState;
  return *s;
}

}  // namespace

namespace {
std::atomic<bool> g_grpc_used{false};
std::atomic<bool> g_forked_after_grpc{false};
void AfterForkChild() {
  if (g_grpc_used.load()) g_forked_after_grpc.store(true);
}
}  // namespace

void NoteGrpcUsed() {
  static const int registered = pthread_atfork(nullptr, nullptr, AfterForkChild);
  (void)registered;
  g_grpc_used.store(true);
}

Status CheckGrpcUsable() {
  if (g_forked_after_grpc.load())
    return FailedPreconditionError(
        "this process was forked after its parent used gRPC (a profiler server or a capture); gRPC cannot run "
        "in such a child. Start the child with exec (subprocess, multiprocessing's 'spawn' or 'forkserver'), or "
        "fork before the parent starts its server");
  return Status::Ok();
}

}  // namespace spyglass::server

namespace spyglass::profiler {


Status start_server(int port, const ServerOptions& options) {
  using namespace spyglass::server;
  if (Status s = CheckGrpcUsable(); !s.ok()) return s;
  if (port < 0 || port > 65535) return InvalidArgumentError("port must be between 0 and 65535, got " + std::to_string(port));
  if (options.bind_address.empty() || options.bind_address.find_first_of("/ ") != std::string::npos)
    return InvalidArgumentError("bad bind_address '" + options.bind_address + "'");
  if (options.max_duration_ms == 0) return InvalidArgumentError("max_duration_ms must be > 0");
  if (!options.allowed_log_root.empty() &&
      (options.allowed_log_root[0] != '/' || options.allowed_log_root.find("/..") != std::string::npos ||
       options.allowed_log_root.find("/./") != std::string::npos))
    return InvalidArgumentError("allowed_log_root must be a clean absolute path, got '" + options.allowed_log_root + "'");
  ServerState& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.server) return FailedPreconditionError("Only one profiler server can be active at a time (it listens on port " +
                                                std::to_string(st.port) + ")");
  std::string host = options.bind_address;
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
  std::string address = host + ":" + std::to_string(port);
  auto service = std::make_unique<ProfilerServiceImpl>(options);
  NoteGrpcUsed();
  grpc::ServerBuilder builder;
  int selected = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &selected);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a port in use must fail, not be shared
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || selected == 0)
    return UnavailableError("cannot start the profiler server on " + address +
                            ": the port is in use or the address cannot be bound");
  st.service = std::move(service);
  st.server = std::move(server);
  st.port = selected;
  return Status::Ok();
}

Status stop_server() {
  using namespace spyglass::server;
  ServerState& st = state();
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<ProfilerServiceImpl> service;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (!st.server) return FailedPreconditionError("No active profiler server.");
    server = std::move(st.server);
    service = std::move(st.service);
    st.port = 0;
  }
  service->BeginShutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  return Status::Ok();
}

int server_port() {
  server::ServerState& st = server::state();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.port;
}

}  // namespace spyglass::profiler
