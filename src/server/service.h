// The profiler service (tensorflow.ProfilerService) over session::Session.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
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

  // Makes running and waiting Profile calls end (with CANCELLED) and new
  // ones fail.
  void BeginShutdown();

 private:
  enum class WaitEnd { kTimeUp, kTerminated, kClientGone, kStopping };
  // Waits until `until`, or until the client leaves, Terminate(session_id)
  // arrives (consumed) or the server stops, whichever comes first.
  WaitEnd Wait(grpc::ServerContext* ctx, const std::string& session_id,
               std::chrono::steady_clock::time_point until);

  profiler::ServerOptions options_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<int> delayed_starts_{0};  // Profile calls waiting for their start time
  std::mutex mu_;
  std::condition_variable cv_;          // Terminate or shutdown happened
  std::deque<std::string> terminated_;  // session ids asked to end, oldest first (bounded)
};

}  // namespace spyglass::server
