#include "server/service.h"

#include <pthread.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

#include "common/clock.h"
#include "common/quote.h"
#include "export/export.h"
#include "export/xplane/xplane_writer.h"
#include "server/path_policy.h"
#include "server/request_policy.h"
#include "server/rpc_util.h"
#include "session/session.h"

namespace spyglass::server {
namespace {

constexpr char kBusy[] =
    "already profiling: another profiling session (a remote capture or start_trace) is running in this process; "
    "try again when it has finished";
// Terminate ids kept for calls that have not consumed them yet (each at most
// kMaxNameBytes): a Terminate may arrive just before its Profile call.
constexpr size_t kMaxPendingTerminates = 256;
// Requests waiting for a delayed start at once (each holds a server thread).
constexpr int kMaxDelayedStarts = 8;

// Gives the allocator's free memory back to the system when a Profile call
// is over: its model and reply (gRPC copies the reply into 1 MiB blocks, freed
// after sending) are gone, and glibc would keep their pages otherwise. The
// call's interceptors are destroyed after the reply was sent and freed.
class TrimAfterProfile : public grpc::experimental::Interceptor {
 public:
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override { methods->Proceed(); }
  ~TrimAfterProfile() override {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
  }
};

class TrimAfterProfileFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return std::string_view(info->method()) == "/tensorflow.ProfilerService/Profile" ? new TrimAfterProfile : nullptr;
  }
};

}  // namespace

CaptureBuilder::CaptureBuilder() {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      std::function<void()>* job = jobs_.front();
      jobs_.pop_front();
      lock.unlock();
      (*job)();
      lock.lock();
      *job = nullptr;  // done: the waiting caller may go
      cv_.notify_all();
    }
  });
}

CaptureBuilder::~CaptureBuilder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CaptureBuilder::Run(const std::function<void()>& job) {
  std::function<void()> mine = job;
  std::unique_lock<std::mutex> lock(mu_);
  jobs_.push_back(&mine);
  cv_.notify_all();
  cv_.wait(lock, [&mine] { return !mine; });
}

void ProfilerServiceImpl::WaitForCalls() {
  std::unique_lock<std::mutex> lock(calls_->mu);
  calls_->cv.wait(lock, [this] { return calls_->running == 0; });
}

grpc::ServerUnaryReactor* ProfilerServiceImpl::Profile(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                                       grpc::ByteBuffer* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto request = std::make_shared<tensorflow::ProfileRequest>();
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (req->Dump(&slices).ok())
    for (const grpc::Slice& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  if (!request->ParseFromString(bytes)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the ProfileRequest does not parse"));
    return reactor;
  }
  std::shared_ptr<CallCount> calls = calls_;
  {
    std::lock_guard<std::mutex> lock(calls->mu);
    ++calls->running;
  }
  // A capture waits for its duration: a thread per call, not gRPC's.
  std::thread([this, ctx, reactor, resp, request, calls] {
    ReplyBytes out;
    grpc::Status st = RunProfile(ctx, *request, &out);
    if (st.ok()) {
      grpc::Slice parts[2] = {grpc::Slice(out.head), grpc::Slice()};
      size_t n = 1;
      if (out.payload) {
        std::string* payload = out.payload.release();
        parts[1] = grpc::Slice(
            payload->data(), payload->size(), [](void* p) { delete static_cast<std::string*>(p); }, payload);
        n = 2;
      }
      *resp = grpc::ByteBuffer(parts, n);
    }
    reactor->Finish(st);  // ctx, resp and the service may go from here on
    std::lock_guard<std::mutex> lock(calls->mu);
    --calls->running;
    calls->cv.notify_all();
  }).detach();
  return reactor;
}

void ProfilerServiceImpl::BeginShutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_.store(true);
  }
  cv_.notify_all();
}

ProfilerServiceImpl::WaitEnd ProfilerServiceImpl::Wait(grpc::ServerContextBase* ctx, const std::string& session_id,
                                                       std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (shutting_down_.load()) return WaitEnd::kStopping;
    auto t = std::find(terminated_.begin(), terminated_.end(), session_id);
    if (t != terminated_.end()) {
      terminated_.erase(t);
      return WaitEnd::kTerminated;
    }
    if (ctx->IsCancelled()) return WaitEnd::kClientGone;
    auto now = std::chrono::steady_clock::now();
    if (now >= until) return WaitEnd::kTimeUp;
    // Terminate and shutdown notify; a client leaving does not, so poll it.
    cv_.wait_until(lock, std::min(until, now + std::chrono::milliseconds(5)));
  }
}

grpc::Status ProfilerServiceImpl::Terminate(grpc::ServerContext*, const tensorflow::TerminateRequest* req,
                                            tensorflow::TerminateResponse*) {
  const std::string& id = req->session_id();
  if (Status s = CheckTerminateId(id); !s.ok()) return ToGrpc(s);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::find(terminated_.begin(), terminated_.end(), id) == terminated_.end()) {
      if (terminated_.size() >= kMaxPendingTerminates) terminated_.pop_front();  // a stale id nobody consumed
      terminated_.push_back(id);
    }
  }
  cv_.notify_all();
  return grpc::Status::OK;
}

grpc::Status ProfilerServiceImpl::Monitor(grpc::ServerContext*, const tensorflow::MonitorRequest*,
                                          tensorflow::MonitorResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "unimplemented.");
}

namespace {
constexpr char kXPlaneToolName[] = "xplane.pb";
grpc::Status Reply(const tensorflow::ProfileRequest& request, const PreparedCapture& p, model::Space space,
                   ReplyBytes* out);
}  // namespace

grpc::Status ProfilerServiceImpl::RunProfile(grpc::ServerContextBase* ctx, const tensorflow::ProfileRequest& request,
                                             ReplyBytes* resp) {
  const tensorflow::ProfileRequest* req = &request;
  using Clock = std::chrono::steady_clock;
  if (shutting_down_.load()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the profiler server is stopping");
  PreparedCapture p;
  if (Status s = PrepareCapture(options_, *req, internal::wall_ns(), &p); !s.ok()) return ToGrpc(s);
  const std::string& session_id = p.session_id;
  if (p.delay_ns > 0) {
    if (delayed_starts_.fetch_add(1) >= kMaxDelayedStarts) {
      delayed_starts_.fetch_sub(1);
      return ToGrpc(UnavailableError("too many captures wait for a delayed start (at most " +
                                     std::to_string(kMaxDelayedStarts) + "); try again later"));
    }
    WaitEnd waited = Wait(ctx, session_id, Clock::now() + std::chrono::nanoseconds(p.delay_ns));
    delayed_starts_.fetch_sub(1);
    switch (waited) {
      case WaitEnd::kTimeUp: break;
      case WaitEnd::kTerminated:
        return grpc::Status(grpc::StatusCode::CANCELLED,
                            "Terminate named this session before its delayed start; nothing was recorded");
      case WaitEnd::kClientGone:
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away before the delayed start");
      case WaitEnd::kStopping:
        return grpc::Status(grpc::StatusCode::CANCELLED, "the profiler server is stopping");
    }
  }

  if (auto fr = p.options.advanced_configuration.find("spyglass_flight_recorder");
      fr != p.options.advanced_configuration.end() && fr->second.is_bool() && fr->second.as_bool()) {
    // The running flight recorder's ring, at once: no session, no waiting.
    grpc::Status st;
    builder_.Run([&] {
      model::Space space;
      Status s = session::Session::SnapshotFlightRecorder(&space);
      st = s.ok() ? Reply(*req, p, std::move(space), resp) : ToGrpc(s);
    });
    return st;
  }

  std::unique_ptr<session::Session> session;
  if (Status s = session::Session::Create(p.options, kBusy, &session); !s.ok()) return ToGrpc(s);

  // Record until the duration passed, Terminate(session_id), the client left
  // or the server stops.
  auto end =
      Clock::now() + std::chrono::milliseconds(p.duration_ms == kUntilTerminate ? int64_t{1} << 40 : p.duration_ms);
  switch (Wait(ctx, session_id, end)) {
    case WaitEnd::kTimeUp:
    case WaitEnd::kTerminated: break;
    case WaitEnd::kClientGone:
      session.reset();  // stops and discards
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away; the capture was stopped");
    case WaitEnd::kStopping:
      session.reset();
      return grpc::Status(grpc::StatusCode::CANCELLED, "the profiler server is stopping; the capture was stopped");
  }

  grpc::Status st;
  builder_.Run([&] {
    model::Space space;
    session::SessionSummary summary;
    Status collect = session->Stop(&space, &summary);
    session.reset();
    if (!collect.ok()) std::fprintf(stderr, "spyglass server: %s\n", collect.ToString().c_str());
    st = Reply(*req, p, std::move(space), resp);
  });
  return st;
}

namespace {
// Appends a varint (protobuf wire format).
void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
// The key of a length-delimited field.
void PutBytesKey(int field, uint64_t size, std::string* out) {
  PutVarint(static_cast<uint64_t>(field) << 3 | 2, out);
  PutVarint(size, out);
}

// The reply of a capture: the model written by this process (export step), or
// sent back as a serialized XSpace, in field `xspace` (emit_xspace) or as
// tool data "xplane.pb". The wire bytes are made here: ProfileResponse's
// empty_trace, then the key of the field whose bytes (out->payload) follow.
grpc::Status Reply(const tensorflow::ProfileRequest& request, const PreparedCapture& p, model::Space space,
                   ReplyBytes* out) {
  const tensorflow::ProfileRequest* req = &request;
  space.warnings.insert(space.warnings.end(), p.warnings.begin(), p.warnings.end());
  if (space.event_count() == 0) {
    PutVarint(tensorflow::ProfileResponse::kEmptyTraceFieldNumber << 3 | 0, &out->head);
    PutVarint(1, &out->head);
  }
  if (p.write_file) {  // this process writes the file (allowed_log_root): the export step, from the model
    exporter::OutputDir dir;
    if (Status s = OpenProfileDir(p.target, &dir); !s.ok()) return ToGrpc(s);
    exporter::ExportedFiles files;
    return ToGrpc(exporter::Export(space, dir, {{exporter::Format::kXPlane}, p.target.stem, {}}, &files));
  }
  // Cut to fit protobuf's 2 GB limit if it must be (counted and warned in it).
  out->payload = std::make_unique<std::string>();
  if (Status s = exporter::SerializeXSpace(space, out->payload.get()); !s.ok()) return ToGrpc(s);
  space = model::Space{};  // freed before gRPC sends the reply
  const uint64_t n = out->payload->size();
  if (req->emit_xspace()) {
    PutBytesKey(tensorflow::ProfileResponse::kXspaceFieldNumber, n, &out->head);
    return grpc::Status::OK;
  }
  // No allowed_log_root: the file comes back as tool data, which clients
  // (tsl's capture: jax.collect_profile, XProf, TensorBoard) write to
  // <repository_root>/<session_id>/<host>.xplane.pb themselves.
  std::string name_field;
  PutBytesKey(tensorflow::ProfileToolData::kNameFieldNumber, sizeof kXPlaneToolName - 1, &name_field);
  name_field += kXPlaneToolName;
  std::string data_key;
  PutBytesKey(tensorflow::ProfileToolData::kDataFieldNumber, n, &data_key);
  PutBytesKey(tensorflow::ProfileResponse::kToolDataFieldNumber, name_field.size() + data_key.size() + n, &out->head);
  out->head += name_field;
  out->head += data_key;
  return grpc::Status::OK;
}
}  // namespace

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
    return InvalidArgumentError("bad bind_address " + QuoteInput(options.bind_address));
  if (options.max_duration_ms == 0) return InvalidArgumentError("max_duration_ms must be > 0");
  if (options.max_buffer_bytes_per_thread == 0 || options.max_buffer_bytes_total == 0)
    return InvalidArgumentError("max_buffer_bytes_per_thread and max_buffer_bytes_total must be > 0");
  ServerOptions resolved = options;
  if (resolved.allowed_log_root.empty()) {
    if (const char* env = std::getenv(kEnvAllowedLogRoot); env != nullptr) resolved.allowed_log_root = env;
  }
  if (!resolved.allowed_log_root.empty() &&
      (resolved.allowed_log_root[0] != '/' || resolved.allowed_log_root.find("/..") != std::string::npos ||
       resolved.allowed_log_root.find("/./") != std::string::npos))
    return InvalidArgumentError(std::string("allowed_log_root (or ") + kEnvAllowedLogRoot +
                                ") must be a clean absolute path, got " + QuoteInput(resolved.allowed_log_root));
  ServerState& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.server) return AlreadyExistsError("Only one profiler server can be active at a time (it listens on port " +
                                                std::to_string(st.port) + ")");
  std::string host = options.bind_address;
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
  std::string address = host + ":" + std::to_string(port);
  auto service = std::make_unique<ProfilerServiceImpl>(resolved);
  NoteGrpcUsed();
  grpc::ServerBuilder builder;
  int selected = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &selected);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a port in use must fail, not be shared
  builder.RegisterService(service.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<TrimAfterProfileFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
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
  service->WaitForCalls();
  return Status::Ok();
}

int server_port() {
  server::ServerState& st = server::state();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.port;
}

}  // namespace spyglass::profiler
