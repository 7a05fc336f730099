// register_subprocess and the tracer that captures registered children along
// with this process (spec PROTOCOL.md section 8).
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "model/xspace_import.h"
#include "profiler_service.grpc.pb.h"
#include "server/merge.h"
#include "server/options_convert.h"
#include "server/rpc_util.h"
#include "session/tracer.h"
#include "spyglass/server.h"
#include "trace/clock.h"

namespace spyglass::server {

namespace {

struct SubprocessInfo {
  int pid = 0;
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::string ToString() const {
    return "SubprocessInfo(pid: " + std::to_string(pid) + ", address: " + address + ")";
  }
};

std::mutex& registry_mu() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<int, SubprocessInfo>& registry() {
  static auto* r = new std::map<int, SubprocessInfo>;
  return *r;
}

bool WantsSubprocesses(const profiler::ProfileOptions& o) {
  auto it = o.advanced_configuration.find("profile_subprocesses");
  // Registering a child is the opt-in; a capture can still say false.
  return it == o.advanced_configuration.end() || !it->second.is_bool() || it->second.as_bool();
}

// One child's part of a capture: a Profile call that runs until Terminate.
struct ChildCall {
  SubprocessInfo info;
  std::string session_id;
  grpc::ClientContext ctx;
  tensorflow::ProfileResponse response;
  grpc::Status status;
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool cancelled_by_us = false;  // it did not answer Terminate, or not in time
};

class SubprocessTracer : public session::Tracer {
 public:
  SubprocessTracer(const profiler::ProfileOptions& options, std::vector<SubprocessInfo> children)
      : options_(options), children_(std::move(children)) {}
  ~SubprocessTracer() override { (void)Stop(); }

  Status Start() override {
    start_ns_ = internal::wall_ns();
    uint64_t ms = start_ns_ / 1000000;
    for (const SubprocessInfo& info : children_) {
      auto call = std::make_unique<ChildCall>();
      call->info = info;
      call->session_id = "subprocess_" + std::to_string(info.pid) + "_" + std::to_string(ms);
      tensorflow::ProfileRequest req;
      profiler::ProfileOptions o = options_;
      o.duration_ms = std::numeric_limits<uint64_t>::max();
      o.start_timestamp_ns = 0;
      o.session_id.clear();
      *req.mutable_opts() = ToProto(o);
      req.mutable_opts()->set_device_type(tensorflow::ProfileOptions::CPU);
      req.set_duration_ms(std::numeric_limits<uint64_t>::max());
      req.set_emit_xspace(true);
      req.set_session_id(call->session_id);
      call->ctx.set_deadline(AfterMs(int64_t{48} * 3600 * 1000));
      ChildCall* c = call.get();
      call->thread = std::thread([c, req = std::move(req)] {
        auto stub = tensorflow::ProfilerService::NewStub(c->info.channel);
        grpc::Status st = stub->Profile(&c->ctx, req, &c->response);
        std::lock_guard<std::mutex> lock(c->mu);
        c->status = st;
        c->done = true;
        c->cv.notify_all();
      });
      calls_.push_back(std::move(call));
    }
    return Status::Ok();
  }

  Status Stop() override {
    if (stopped_) return Status::Ok();
    stopped_ = true;
    // Ask every child to finish; a child that cannot be told is cancelled.
    for (auto& c : calls_) {
      {
        std::lock_guard<std::mutex> lock(c->mu);
        if (c->done) continue;
      }
      auto stub = tensorflow::ProfilerService::NewStub(c->info.channel);
      grpc::ClientContext ctx;
      ctx.set_deadline(AfterMs(2000));
      tensorflow::TerminateRequest req;
      req.set_session_id(c->session_id);
      tensorflow::TerminateResponse resp;
      if (!stub->Terminate(&ctx, req, &resp).ok()) {
        c->cancelled_by_us = true;
        c->ctx.TryCancel();
      }
    }
    // Bounded wait for the replies (a child serializes its profile first).
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (auto& c : calls_) {
      {
        std::unique_lock<std::mutex> lock(c->mu);
        if (!c->cv.wait_until(lock, deadline, [&] { return c->done; })) {
          c->cancelled_by_us = true;
          lock.unlock();
          c->ctx.TryCancel();
        }
      }
      if (c->thread.joinable()) c->thread.join();
    }
    return Status::Ok();
  }

  Status CollectData(model::Space* space) override {
    for (auto& c : calls_) {
      std::string who = c->info.ToString();
      if (!c->status.ok()) {
        std::string why = c->cancelled_by_us ? "it did not answer; the call was abandoned"
                                             : FromGrpc(c->status, c->info.address).message();
        std::string w = "subprocess " + std::to_string(c->info.pid) + " at " + c->info.address +
                        " was not captured (" + why +
                        "); the profile has this process's data only for it";
        space->warnings.push_back(w);
        std::fprintf(stderr, "spyglass: warning: %s\n", w.c_str());
        continue;
      }
      if (c->response.empty_trace() || !c->response.has_xspace()) {
        space->warnings.push_back("No XSpace data returned from subprocess: " + who);
        if (!c->response.has_xspace()) continue;
      }
      model::Space child;
      model::ImportXSpace(c->response.xspace(), &child);
      c->response.Clear();
      MergeChildSpace(std::move(child), start_ns_, std::to_string(c->info.pid), /*require_process_id=*/true, space);
    }
    calls_.clear();
    return Status::Ok();
  }

 private:
  profiler::ProfileOptions options_;
  std::vector<SubprocessInfo> children_;
  std::vector<std::unique_ptr<ChildCall>> calls_;
  uint64_t start_ns_ = 0;
  bool stopped_ = false;
};

// Off unless a child is registered (or the capture says false).
std::unique_ptr<session::Tracer> MakeSubprocessTracer(const profiler::ProfileOptions& o) {
  if (!WantsSubprocesses(o)) return nullptr;
  std::vector<SubprocessInfo> children;
  {
    std::lock_guard<std::mutex> lock(registry_mu());
    for (const auto& [pid, info] : registry()) children.push_back(info);
  }
  if (children.empty()) return nullptr;
  return std::make_unique<SubprocessTracer>(o, std::move(children));
}

SPYGLASS_REGISTER_TRACER(subprocesses, session::kRankSubprocesses, MakeSubprocessTracer);

}  // namespace
}  // namespace spyglass::server

namespace spyglass::profiler {

void SubprocessRegistration::unregister() {
  if (pid_ == 0) return;
  std::lock_guard<std::mutex> lock(server::registry_mu());
  server::registry().erase(pid_);
  pid_ = 0;
}

Status register_subprocess(int pid, int port, SubprocessRegistration* out, int connect_timeout_ms) {
  if (Status s = server::CheckGrpcUsable(); !s.ok()) return s;
  using namespace spyglass::server;
  if (out == nullptr) return InvalidArgumentError("register_subprocess: out is null");
  if (pid <= 0) return InvalidArgumentError("bad pid " + std::to_string(pid));
  if (pid == getpid()) return InvalidArgumentError("Cannot register subprocess with the same pid as current process.");
  if (port <= 0 || port > 65535) return InvalidArgumentError("port must be between 1 and 65535, got " + std::to_string(port));
  SubprocessInfo info;
  info.pid = pid;
  info.address = "127.0.0.1:" + std::to_string(port);
  {
    std::lock_guard<std::mutex> lock(registry_mu());
    auto it = registry().find(pid);
    if (it != registry().end()) return AlreadyExistsError(it->second.ToString() + " already registered");
  }
  info.channel = MakeChannel(info.address);
  if (!info.channel) return InternalError("Unable to create channel to " + info.address);
  if (!info.channel->WaitForConnected(AfterMs(connect_timeout_ms < 0 ? 0 : connect_timeout_ms)))
    return DeadlineExceededError("Timeout while connecting to " + info.address + " (is the subprocess's profiler "
                                 "server running? it must call start_server(" + std::to_string(port) + "))");
  {
    std::lock_guard<std::mutex> lock(registry_mu());
    auto [it, inserted] = registry().emplace(pid, info);
    if (!inserted) return AlreadyExistsError(it->second.ToString() + " already registered");
  }
  out->unregister();
  out->pid_ = pid;
  return Status::Ok();
}

}  // namespace spyglass::profiler
