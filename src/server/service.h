// The profiler service (tensorflow.ProfilerService) over session::Session.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "profiler_service.grpc.pb.h"
#include "spyglass/server.h"

namespace spyglass::server {

// Runs jobs one at a time on a thread of its own. The memory of every
// capture (the model, the reply's bytes) is allocated there: glibc gives each
// thread an arena, and frees at the top of another thread's arena stay
// resident (malloc_trim releases only the main arena's top). One builder
// thread: one arena holds what captures leave, not one per gRPC thread.
class CaptureBuilder {
 public:
  CaptureBuilder();
  ~CaptureBuilder();
  // Runs `job` on the builder thread and waits for it.
  void Run(const std::function<void()>& job);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>*> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

// A Profile reply as its wire bytes: a few header bytes and the serialized
// XSpace, handed to gRPC as they are (no copy into gRPC's own blocks).
struct ReplyBytes {
  std::string head;
  std::unique_ptr<std::string> payload;
};

// Profile is a raw callback method: its reply is a ByteBuffer of our bytes.
// Each call runs on a thread of its own (a capture waits for its duration);
// the calls in flight are counted so that the service outlives them.
class ProfilerServiceImpl final
    : public tensorflow::ProfilerService::WithRawCallbackMethod_Profile<tensorflow::ProfilerService::Service> {
 public:
  explicit ProfilerServiceImpl(profiler::ServerOptions options)
      : options_(std::move(options)), calls_(std::make_shared<CallCount>()) {}

  grpc::ServerUnaryReactor* Profile(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                    grpc::ByteBuffer* resp) override;
  grpc::Status Terminate(grpc::ServerContext* ctx, const tensorflow::TerminateRequest* req,
                         tensorflow::TerminateResponse* resp) override;
  grpc::Status Monitor(grpc::ServerContext* ctx, const tensorflow::MonitorRequest* req,
                       tensorflow::MonitorResponse* resp) override;

  // Makes running and waiting Profile calls end (with CANCELLED) and new
  // ones fail.
  void BeginShutdown();
  // Waits until no Profile call runs (after the server's Shutdown).
  void WaitForCalls();

 private:
  struct CallCount {
    std::mutex mu;
    std::condition_variable cv;
    int running = 0;
  };
  grpc::Status RunProfile(grpc::ServerContextBase* ctx, const tensorflow::ProfileRequest& req, ReplyBytes* out);
  enum class WaitEnd { kTimeUp, kTerminated, kClientGone, kStopping };
  // Waits until `until`, or until the client leaves, Terminate(session_id)
  // arrives (consumed) or the server stops, whichever comes first.
  WaitEnd Wait(grpc::ServerContextBase* ctx, const std::string& session_id,
               std::chrono::steady_clock::time_point until);

  profiler::ServerOptions options_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<int> delayed_starts_{0};  // Profile calls waiting for their start time
  std::mutex mu_;
  std::condition_variable cv_;          // Terminate or shutdown happened
  std::deque<std::string> terminated_;  // session ids asked to end, oldest first (bounded)
  std::shared_ptr<CallCount> calls_;    // shared with the call threads, which may end after the service
  CaptureBuilder builder_;
};

}  // namespace spyglass::server
