// The profiler server against hostile or careless clients: delayed starts
// that must not hold the profiler, buffer sizes above the program's own,
// huge Terminate ids, deep repository roots, huge fields in errors, and the
// memory a capture leaves behind.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "profiler_service.grpc.pb.h"
#include "server/rpc_util.h"
#include "session/session.h"
#include "spyglass/annotation.h"
#include "spyglass/profiler.h"
#include "spyglass/server.h"
#include "annotating_child.h"
#include "process_memory.h"
#include "test_util.h"

extern char** environ;

namespace spyglass {
namespace {

namespace fs = std::filesystem;
namespace prof = spyglass::profiler;
using namespace std::chrono_literals;
using spyglass::testing::AnnotatingChild;
using spyglass::testing::Events;
using spyglass::testing::FindPlane;
using spyglass::testing::MakeTempDir;
using spyglass::testing::PlaneStats;
using spyglass::testing::StatusKb;

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}


uint64_t WallNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

size_t CountEntries(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    ++n;
  return n;
}

// Annotates on a thread while alive: in a tight loop (fills buffers fast),
// or one event a millisecond.
class BusyAnnotator {
 public:
  explicit BusyAnnotator(bool tight = true) {
    t_ = std::thread([this, tight] {
      for (int64_t n = 0; !stop_; ++n) {
        prof::TraceAnnotation a("hostile_busy", {{"n", n}});
        if (!tight) std::this_thread::sleep_for(1ms);
      }
    });
  }
  ~BusyAnnotator() {
    stop_ = true;
    t_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread t_;
};

class HostileServerTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }
  void TearDown() override { (void)prof::stop_server(); }

  void Start(const prof::ServerOptions& o) {
    (void)prof::stop_server();
    ASSERT_TRUE(prof::start_server(0, o).ok());
    address_ = "127.0.0.1:" + std::to_string(prof::server_port());
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    stub_ = tensorflow::ProfilerService::NewStub(
        grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args));
  }

  static tensorflow::ProfileRequest Request(uint64_t duration_ms, const std::string& session) {
    tensorflow::ProfileRequest r;
    r.mutable_opts()->set_version(1);
    r.mutable_opts()->set_host_tracer_level(2);
    r.mutable_opts()->set_duration_ms(duration_ms);
    r.set_duration_ms(duration_ms);
    r.set_session_id(session);
    r.set_host_name("h");
    r.set_emit_xspace(true);
    return r;
  }
  grpc::Status Call(const tensorflow::ProfileRequest& r, tensorflow::ProfileResponse* resp = nullptr,
                    std::chrono::milliseconds deadline = 20s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    tensorflow::ProfileResponse local;
    return stub_->Profile(&ctx, r, resp ? resp : &local);
  }
  grpc::Status Terminate(const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    tensorflow::TerminateRequest r;
    r.set_session_id(id);
    tensorflow::TerminateResponse resp;
    return stub_->Terminate(&ctx, r, &resp);
  }

  std::string address_;
  std::unique_ptr<tensorflow::ProfilerService::Stub> stub_;
};

// ---- 1. A delayed start waits without the session, and can be cancelled ----

TEST_F(HostileServerTest, DelayedStartDoesNotHoldTheProfiler) {
  auto r = Request(100, "delayed");
  r.mutable_opts()->set_start_timestamp_ns(WallNs() + 30'000'000'000ull);  // 30 s ahead
  grpc::Status g;
  auto t0 = std::chrono::steady_clock::now();
  std::thread waiting([&] { g = Call(r, nullptr, 60s); });
  std::this_thread::sleep_for(300ms);
  // Meanwhile the program's own trace and another capture work.
  EXPECT_FALSE(session::SessionActive());
  Status s = prof::start_trace(MakeTempDir());
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (s.ok()) EXPECT_TRUE(prof::stop_trace().ok());
  EXPECT_TRUE(Call(Request(50, "other")).ok());
  // Terminate of its session id ends the wait.
  EXPECT_TRUE(Terminate("delayed").ok());
  waiting.join();
  EXPECT_EQ(g.error_code(), grpc::StatusCode::CANCELLED) << g.error_message();
  EXPECT_NE(g.error_message().find("Terminate"), std::string::npos) << g.error_message();
  EXPECT_LT(SecondsSince(t0), 10.0);
}

TEST_F(HostileServerTest, StopServerEndsADelayedStart) {
  auto r = Request(100, "delayed_stop");
  r.mutable_opts()->set_start_timestamp_ns(WallNs() + 30'000'000'000ull);
  grpc::Status g;
  std::thread waiting([&] { g = Call(r, nullptr, 60s); });
  std::this_thread::sleep_for(300ms);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(prof::stop_server().ok());
  EXPECT_LT(SecondsSince(t0), 10.0);
  waiting.join();
  EXPECT_FALSE(g.ok());
  EXPECT_FALSE(session::SessionActive());
}

TEST_F(HostileServerTest, DelayedStartsWaitingAtOnceAreBounded) {
  constexpr int kBound = 8, kCalls = 12;  // 8: the server's bound
  std::vector<std::thread> threads;
  std::vector<grpc::Status> results(kCalls);
  std::atomic<int> done{0};
  uint64_t start = WallNs() + 30'000'000'000ull;
  for (int i = 0; i < kCalls; ++i)
    threads.emplace_back([&, i] {
      auto r = Request(100, "wait_" + std::to_string(i));
      r.mutable_opts()->set_start_timestamp_ns(start);
      results[i] = Call(r, nullptr, 60s);
      ++done;
    });
  // The calls over the bound are refused at once; the others wait.
  for (int i = 0; i < 200 && done < kCalls - kBound; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(done.load(), kCalls - kBound);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(prof::stop_server().ok());
  for (auto& t : threads) t.join();
  EXPECT_LT(SecondsSince(t0), 10.0);
  int cancelled = 0, refused = 0;
  for (const auto& res : results) {
    cancelled += res.error_code() == grpc::StatusCode::CANCELLED;
    if (res.error_code() == grpc::StatusCode::UNAVAILABLE) {
      ++refused;
      EXPECT_NE(res.error_message().find("delayed start"), std::string::npos) << res.error_message();
    }
  }
  EXPECT_EQ(cancelled, kBound);
  EXPECT_EQ(refused, kCalls - kBound);
}

TEST_F(HostileServerTest, ClientGoneEndsADelayedStart) {
  auto r = Request(100, "delayed_gone");
  r.mutable_opts()->set_start_timestamp_ns(WallNs() + 30'000'000'000ull);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Call(r, nullptr, 300ms).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The handler noticed: a capture now runs at once.
  EXPECT_TRUE(Call(Request(50, "after")).ok());
  EXPECT_LT(SecondsSince(t0), 10.0);
}

TEST_F(HostileServerTest, StartBeyondTheDelayLimitIsRejected) {
  auto r = Request(100, "far");
  r.mutable_opts()->set_start_timestamp_ns(WallNs() + 120'000'000'000ull);  // default limit: 60 s
  auto t0 = std::chrono::steady_clock::now();
  grpc::Status g = Call(r);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << g.error_message();
  EXPECT_NE(g.error_message().find("max_start_delay_ms"), std::string::npos) << g.error_message();
  EXPECT_LT(SecondsSince(t0), 5.0);
}

TEST_F(HostileServerTest, ShortDelayedStartStillCaptures) {
  BusyAnnotator slow(/*tight=*/false);
  auto r = Request(100, "soon");
  r.mutable_opts()->set_start_timestamp_ns(WallNs() + 300'000'000ull);
  tensorflow::ProfileResponse resp;
  grpc::Status g = Call(r, &resp);
  ASSERT_TRUE(g.ok()) << g.error_message();
  EXPECT_FALSE(resp.empty_trace());
}

// ---- 2. Buffer sizes above the server's ceilings are clamped -----------------

// The warning the capture carries, or "".
std::string Warning(const tensorflow::ProfileResponse& resp, const std::string& needle) {
  for (const auto& w : resp.xspace().warnings())
    if (w.find(needle) != std::string::npos) return w;
  return "";
}

TEST_F(HostileServerTest, RemoteBufferSizesAreClampedToTheProgramsDefaults) {
  auto r = Request(200, "big_buffers");
  auto& adv = *r.mutable_opts()->mutable_advanced_configuration();
  adv["spyglass_buffer_bytes_per_thread"].set_int64_value(3ll << 30);
  adv["spyglass_buffer_bytes_total"].set_int64_value(3ll << 30);
  tensorflow::ProfileResponse resp;
  grpc::Status g = Call(r, &resp);
  ASSERT_TRUE(g.ok()) << g.error_message();
  std::string w = Warning(resp, "spyglass_buffer_bytes_per_thread");
  EXPECT_NE(w.find(std::to_string(prof::ProfileOptions{}.buffer_bytes_per_thread)), std::string::npos) << w;
  w = Warning(resp, "spyglass_buffer_bytes_total");
  EXPECT_NE(w.find(std::to_string(prof::ProfileOptions{}.buffer_bytes_total)), std::string::npos) << w;
}

TEST_F(HostileServerTest, BufferCeilingsBoundWhatARequestRecords) {
  prof::ServerOptions o;
  o.max_buffer_bytes_per_thread = 1 << 20;
  o.max_buffer_bytes_total = 4 << 20;
  Start(o);
  BusyAnnotator busy;
  auto r = Request(300, "ceiling");
  (*r.mutable_opts()->mutable_advanced_configuration())["spyglass_buffer_bytes_per_thread"].set_int64_value(3ll << 30);
  tensorflow::ProfileResponse resp;
  grpc::Status g = Call(r, &resp);
  ASSERT_TRUE(g.ok()) << g.error_message();
  EXPECT_NE(Warning(resp, "spyglass_buffer_bytes_per_thread").find("1048576"), std::string::npos);
  const auto* host = FindPlane(resp.xspace(), "/host:CPU");
  ASSERT_NE(host, nullptr);
  // The busy thread filled its 1 MiB and dropped the rest (at ~16 bytes an
  // event it records far more than 1 MiB in 300 ms).
  EXPECT_NE(PlaneStats(*host)["dropped_events"], "0");
  size_t events = 0;
  for (const auto& e : Events(*host)) events += e.name == "hostile_busy";
  EXPECT_GT(events, 0u);
  EXPECT_LT(events, (1u << 20) / 16);
  // A ceiling of 0 is not a server the program can run.
  o.max_buffer_bytes_total = 0;
  ASSERT_TRUE(prof::stop_server().ok());
  EXPECT_EQ(prof::start_server(0, o).code(), StatusCode::kInvalidArgument);
  Start({});
}

// ---- 3. Terminate ids are bounded in size and number --------------------------

TEST_F(HostileServerTest, HugeTerminateIdsAreRejectedAndNotKept) {
  long before = StatusKb("VmRSS");
  std::string id(1 << 20, 'x');
  for (int i = 0; i < 300; ++i) {
    id[0] = static_cast<char>('a' + i % 26);
    id[1] = static_cast<char>('a' + i / 26 % 26);
    grpc::Status g = Terminate(id);
    ASSERT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << i;
    ASSERT_LT(g.error_message().size(), 512u);
  }
  // Many plain-sized ids: accepted, and only a bounded number kept.
  std::string name(255, 'n');
  for (int i = 0; i < 5000; ++i) {
    std::string s = std::to_string(i);
    std::copy(s.begin(), s.end(), name.begin());
    ASSERT_TRUE(Terminate(name).ok()) << i;
  }
  long after = StatusKb("VmRSS");
  EXPECT_LT(after - before, 100 * 1024) << "RSS grew from " << before << " KiB to " << after << " KiB";
}

// ---- 4. What a request may create is bounded ----------------------------------

TEST_F(HostileServerTest, DeepOrLongRepositoryRootsCreateNothing) {
  std::string root = MakeTempDir();
  prof::ServerOptions o;
  o.allowed_log_root = root;
  Start(o);
  std::string deep = root;
  for (int i = 0; i < 2000; ++i) deep += "/a";
  std::string wide = root;
  for (int i = 0; i < 3; ++i) wide += "/" + std::string(250, 'w');
  std::string long_total = root;
  for (int i = 0; i < 20; ++i) long_total += "/" + std::string(250, 'l');
  std::string nine = root;
  for (int i = 0; i < 7; ++i) nine += "/d";  // 7 + plugins + profile + session = 10 new
  struct Case {
    std::string repository_root, session, expect;
  } cases[] = {
      {deep + "/plugins/profile", "s", "repository_root"},
      {long_total + "/plugins/profile", "s", "4096"},
      {wide + std::string(300, 'c') + "/plugins/profile", "s", "255"},
      {nine + "/plugins/profile", "s", "new directories"},
      {root + "/plugins/profile", std::string(300, 's'), "session_id"},
  };
  for (const Case& c : cases) {
    auto r = Request(50, c.session);
    r.set_emit_xspace(false);
    r.set_repository_root(c.repository_root);
    grpc::Status g = Call(r);
    EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.expect;
    EXPECT_NE(g.error_message().find(c.expect), std::string::npos) << g.error_message();
    EXPECT_LT(g.error_message().size(), 1024u);
  }
  EXPECT_EQ(CountEntries(root), 0u);
  // Within the bounds it works: 8 new directories.
  std::string eight = root;
  for (int i = 0; i < 5; ++i) eight += "/e";
  auto r = Request(50, "ok");
  r.set_emit_xspace(false);
  r.set_repository_root(eight + "/plugins/profile");
  grpc::Status g = Call(r);
  EXPECT_TRUE(g.ok()) << g.error_message();
  EXPECT_TRUE(fs::is_regular_file(eight + "/plugins/profile/ok/h.xplane.pb"));
}

// ---- 5. Errors quote a bounded prefix of what the request sent ----------------

TEST_F(HostileServerTest, HugeFieldsGetShortInvalidArgumentErrors) {
  std::string huge(1 << 20, 'q');
  std::string dir = MakeTempDir();
  prof::ServerOptions o;
  o.allowed_log_root = "/";  // paths are checked only where the server writes
  Start(o);
  std::vector<tensorflow::ProfileRequest> requests;
  requests.push_back(Request(50, huge));  // session id
  auto r = Request(50, "s");
  r.set_emit_xspace(false);
  r.set_repository_root(dir + "/plugins/profile");
  r.set_host_name(huge);
  requests.push_back(r);
  r = Request(50, "s");
  r.set_emit_xspace(false);
  r.set_repository_root("/" + huge + "/plugins/profile");
  requests.push_back(r);
  r = Request(50, "s");
  r.set_emit_xspace(false);
  r.set_repository_root(huge);
  requests.push_back(r);
  r = Request(50, "s");
  (*r.mutable_opts()->mutable_advanced_configuration())[huge].set_bool_value(true);
  requests.push_back(r);
  r = Request(50, "s");
  (*r.mutable_opts()->mutable_advanced_configuration())["tpu_trace_mode"].set_string_value(huge);
  requests.push_back(r);
  r = Request(50, "s");
  (*r.mutable_opts()->mutable_advanced_configuration())["override_hostname"].set_string_value(huge);
  r.set_emit_xspace(false);
  r.set_repository_root(dir + "/plugins/profile");
  requests.push_back(r);
  for (size_t i = 0; i < requests.size(); ++i) {
    grpc::Status g = Call(requests[i]);
    EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << i << ": " << g.error_message().substr(0, 200);
    EXPECT_LT(g.error_message().size(), 1024u) << i;
    EXPECT_NE(g.error_message().find("bytes)"), std::string::npos) << i << ": " << g.error_message().substr(0, 300);
  }
  grpc::Status g = Terminate(huge);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(g.error_message().size(), 1024u);
  EXPECT_EQ(CountEntries(dir), 0u);
}

// ---- 6. A capture's memory goes back after the reply ---------------------------


TEST(HostileServerMemoryTest, CaptureMemoryIsReturnedAfterTheReply) {
  AnnotatingChild child({"--seconds", "120", "--busy", "2"});
  ASSERT_GT(child.port(), 0);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto stub = tensorflow::ProfilerService::NewStub(grpc::CreateCustomChannel(
      "127.0.0.1:" + std::to_string(child.port()), grpc::InsecureChannelCredentials(), args));
  std::this_thread::sleep_for(500ms);  // let the child settle
  long before = StatusKb("VmRSS", child.pid());
  tensorflow::ProfileRequest r;
  r.mutable_opts()->set_version(1);
  r.mutable_opts()->set_host_tracer_level(2);
  r.mutable_opts()->set_duration_ms(1000);
  r.set_duration_ms(1000);
  r.set_session_id("memory");
  r.set_emit_xspace(true);
  // 64 MiB a thread (a quarter of the default) keeps the test short; the
  // busy threads fill it.
  (*r.mutable_opts()->mutable_advanced_configuration())["spyglass_buffer_bytes_per_thread"].set_int64_value(64 << 20);
  tensorflow::ProfileResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 100s);
  grpc::Status g = stub->Profile(&ctx, r, &resp);
  ASSERT_TRUE(g.ok()) << g.error_message();
  long peak = StatusKb("VmHWM", child.pid());
  // The server frees the reply once it is sent, maybe just after we got it.
  constexpr long kBoundKiB = 200 * 1024;
  long after = StatusKb("VmRSS", child.pid());
  for (int i = 0; i < 100 && after - before >= kBoundKiB; ++i) {
    std::this_thread::sleep_for(100ms);
    after = StatusKb("VmRSS", child.pid());
  }
  std::printf("child RSS before %ld KiB, peak %ld KiB, after %ld KiB, reply %zu bytes\n", before, peak, after,
              resp.ByteSizeLong());
  // The reply is a whole XSpace with the busy threads' events.
  const auto* host = FindPlane(resp.xspace(), "/host:CPU");
  ASSERT_NE(host, nullptr);
  bool found = false;
  for (const auto& line : host->lines())
    for (const auto& e : line.events())
      if (host->event_metadata().at(e.metadata_id()).name() == "busy_task") found = true;
  EXPECT_TRUE(found);
  // What stays: the recorder's cache of free chunks (64 MiB), one chunk per
  // thread and allocator slack; not the 128 MiB recorded, nor the model.
  EXPECT_LT(after - before, kBoundKiB) << "before " << before << " KiB, after " << after << " KiB";
}



// One Profile call with a raw reply (not parsed: 40 at once stay cheap here).
size_t RawProfileCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& request) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 120s);
  grpc::ByteBuffer reply;
  grpc::Status g = server::RawUnaryCall(&ctx, channel, "/tensorflow.ProfilerService/Profile", request, &reply);
  EXPECT_TRUE(g.ok()) << g.error_message();
  return g.ok() ? reply.Length() : 0;
}

// VmRSS of `pid` once it stops moving (two readings 500 ms apart within 4 MiB).
long SettledRss(int pid) {
  long last = StatusKb("VmRSS", pid);
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(500ms);
    long now = StatusKb("VmRSS", pid);
    if (std::labs(now - last) < 4 * 1024) return now;
    last = now;
  }
  return last;
}

// Bursts of 40 concurrent flight-recorder captures: what they used is given
// back once the replies are sent, burst after burst (it stayed in glibc's
// per-thread arenas, one per gRPC thread: 80 MB idle grew to 680, then 870).
TEST(HostileServerMemoryTest, FlightRecorderBurstsLeaveNoMemoryBehind) {
  setenv("SPYGLASS_FLIGHT_RECORDER", "10", 1);  // the child's flight recorder, started from outside
  AnnotatingChild child({"--seconds", "300", "--busy", "2"});
  unsetenv("SPYGLASS_FLIGHT_RECORDER");
  ASSERT_GT(child.port(), 0);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(child.port()),
                                           grpc::InsecureChannelCredentials(), args);
  tensorflow::ProfileRequest r;
  r.mutable_opts()->set_version(1);
  r.mutable_opts()->set_host_tracer_level(2);
  r.mutable_opts()->set_duration_ms(1000);
  r.set_duration_ms(1000);
  r.set_emit_xspace(true);
  (*r.mutable_opts()->mutable_advanced_configuration())["spyglass_flight_recorder"].set_bool_value(true);
  const std::string request = r.SerializeAsString();
  std::this_thread::sleep_for(3s);  // the busy threads fill the ring
  long before = SettledRss(child.pid());
  long idle[3] = {0, 0, 0};
  size_t reply = 0;
  for (long& after : idle) {
    std::vector<std::thread> calls;
    std::atomic<size_t> largest{0};
    for (int i = 0; i < 40; ++i)
      calls.emplace_back([&] {
        size_t n = RawProfileCall(channel, request);
        if (n > largest.load()) largest.store(n);
      });
    for (auto& t : calls) t.join();
    reply = largest.load();
    after = SettledRss(child.pid());
  }
  std::printf("child idle RSS before %ld KiB, after bursts %ld, %ld, %ld KiB; reply %zu bytes\n", before, idle[0],
              idle[1], idle[2], reply);
  ASSERT_GT(reply, size_t{1} << 20) << "the ring held too little for the test to mean anything";
  EXPECT_LT(idle[0] - before, 100 * 1024) << "the first burst left its memory behind";
  EXPECT_LT(idle[2] - idle[0], 50 * 1024) << "the idle RSS grew from burst to burst";
}

}  // namespace
}  // namespace spyglass
