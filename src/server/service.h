// The profiler service (tensorflow.ProfilerService) over session::Session.
#pragma once

#include <atomic>
#include <mutex>
#include <set>
#include <string>

#include "profiler_service.grpc.pb.h"
#include "spyglass/server.h"

namespace spyglass::server {

class ProfilerServiceImpl final : public tensorflow::ProfilerService::Service {
 public:
  explicit ProfilerServiceImpl(profiler::ServerOptions options) : options_(std::move(options)) {}

  grpc::Status Profile(grpc::ServerContext* ctx, const tensorflow::ProfileRequest* req,
                       tensorflow::ProfileResponse* resp) override;
  grpc::Status Terminate(grpc::ServerContext* ctx, const tensorflow::TerminateRequest* req,
                         tensorflow::TerminateResponse* resp) override;
  grpc::Status Monitor(grpc::ServerContext* ctx, const tensorflow::MonitorRequest* req,
                       tensorflow::MonitorResponse* resp) override;

  // Makes running Profile calls end (with CANCELLED) and new ones fail.
  void BeginShutdown() { shutting_down_.store(true); }

 private:
  bool TakeTerminate(const std::string& session_id);

  profiler::ServerOptions options_;
  std::atomic<bool> shutting_down_{false};
  std::mutex mu_;
  std::set<std::string> terminated_;  // session ids asked to end
};

}  // namespace spyglass::server
