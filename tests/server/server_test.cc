// The profiler server, the capture client and subprocess propagation, in
// process and against child processes (tests/server/annotating_server.cc).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "profiler_service.grpc.pb.h"
#include "server/client.h"
#include "session/session.h"
#include "spyglass/annotation.h"
#include "spyglass/profiler.h"
#include "spyglass/server.h"
#include "annotating_child.h"
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
using spyglass::testing::ReadGzip;
using spyglass::testing::ReadXSpace;

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Annotates on a thread while alive.
class Annotator {
 public:
  explicit Annotator(const char* name = "server_test_step") : name_(name) {
    t_ = std::thread([this] {
      while (!stop_) {
        prof::TraceAnnotation a{std::string_view(name_)};
        std::this_thread::sleep_for(1ms);
      }
    });
  }
  ~Annotator() {
    stop_ = true;
    t_.join();
  }

 private:
  const char* name_;
  std::atomic<bool> stop_{false};
  std::thread t_;
};


// A listening TCP socket on a free loopback port.
int ListenSocket(int* port, int backlog = 16) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(listen(fd, backlog), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(prof::start_server(0).ok());
    port_ = prof::server_port();
    ASSERT_GT(port_, 0);
    address_ = "127.0.0.1:" + std::to_string(port_);
    auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    stub_ = tensorflow::ProfilerService::NewStub(channel);
  }
  void TearDown() override { (void)prof::stop_server(); }

  tensorflow::ProfileRequest Request(uint64_t duration_ms, const std::string& root, const std::string& session,
                                     const std::string& host) {
    tensorflow::ProfileRequest r;
    r.mutable_opts()->set_version(1);
    r.mutable_opts()->set_host_tracer_level(2);
    r.mutable_opts()->set_duration_ms(duration_ms);
    r.set_duration_ms(duration_ms);
    r.set_repository_root(root);
    r.set_session_id(session);
    r.set_host_name(host);
    return r;
  }
  grpc::Status Call(const tensorflow::ProfileRequest& r, tensorflow::ProfileResponse* resp = nullptr,
                    std::chrono::milliseconds deadline = 20s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    tensorflow::ProfileResponse local;
    return stub_->Profile(&ctx, r, resp ? resp : &local);
  }

  int port_ = 0;
  std::string address_;
  std::unique_ptr<tensorflow::ProfilerService::Stub> stub_;
};

TEST_F(ServerTest, StartStopErrors) {
  Status again = prof::start_server(0);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  EXPECT_EQ(prof::start_server(70000).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(prof::stop_server().ok());
  EXPECT_EQ(prof::stop_server().code(), StatusCode::kFailedPrecondition);
  // A port in use fails clearly.
  int busy_port = 0;
  int fd = ListenSocket(&busy_port);
  Status in_use = prof::start_server(busy_port);
  EXPECT_EQ(in_use.code(), StatusCode::kUnavailable) << in_use.ToString();
  EXPECT_NE(in_use.message().find("in use"), std::string::npos) << in_use.message();
  close(fd);
  ASSERT_TRUE(prof::start_server(0).ok());  // for TearDown
}

TEST_F(ServerTest, CaptureWritesLocalLayoutWithAnnotations) {
  Annotator a("captured_annotation");
  std::string dir = MakeTempDir();
  server::CaptureOptions o;
  o.duration_ms = 300;
  o.create_perfetto_trace = true;
  server::CaptureResult r;
  Status s = server::Capture({address_}, o, dir, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(r.hosts.size(), 1u);
  std::string stem = "127.0.0.1_" + std::to_string(port_);
  EXPECT_EQ(r.hosts[0].xplane_path, r.run_dir + "/" + stem + ".xplane.pb");
  EXPECT_EQ(fs::path(r.run_dir).parent_path(), fs::path(dir) / "plugins" / "profile");
  auto space = ReadXSpace(r.hosts[0].xplane_path);
  const auto* host = FindPlane(space, "/host:CPU");
  ASSERT_NE(host, nullptr);
  int n = 0;
  for (const auto& e : Events(*host)) n += e.name == "captured_annotation";
  EXPECT_GT(n, 50);
  EXPECT_NE(FindPlane(space, "Task Environment"), nullptr);
  EXPECT_NE(ReadGzip(r.hosts[0].trace_json_path).find("captured_annotation"), std::string::npos);
  EXPECT_EQ(r.perfetto_trace_path, r.run_dir + "/perfetto_trace.pb");
  EXPECT_NE(spyglass::testing::ReadFile(r.perfetto_trace_path).find("captured_annotation"), std::string::npos);  // an interned name
  // JAX's perfetto_trace.json.gz: the host's trace JSON under a second name (written once).
  EXPECT_EQ(r.perfetto_trace_json_path, r.run_dir + "/perfetto_trace.json.gz");
  EXPECT_TRUE(fs::equivalent(r.perfetto_trace_json_path, r.hosts[0].trace_json_path));
}

// Without allowed_log_root the server creates nothing a request names (a
// loopback client can be any local user): the profile comes back as tool
// data, which tsl's clients write under their log dir themselves.
TEST_F(ServerTest, ByDefaultServerWritesNothingAndRepliesWithToolData) {
  Annotator a("tool_data_annotation");
  std::string dir = MakeTempDir();
  tensorflow::ProfileResponse resp;
  grpc::Status g = Call(Request(100, dir + "/elsewhere/plugins/profile", "run1", "myhost:1234"), &resp);
  ASSERT_TRUE(g.ok()) << g.error_message();
  EXPECT_FALSE(resp.empty_trace());
  EXPECT_FALSE(resp.has_xspace());
  EXPECT_TRUE(fs::is_empty(dir)) << "the server created files under a directory the request named";
  ASSERT_EQ(resp.tool_data_size(), 1);
  EXPECT_EQ(resp.tool_data(0).name(), "xplane.pb");
  tensorflow::profiler::XSpace space;
  ASSERT_TRUE(space.ParseFromString(resp.tool_data(0).data()));
  const auto* host = FindPlane(space, "/host:CPU");
  ASSERT_NE(host, nullptr);
  int n = 0;
  for (const auto& e : Events(*host)) n += e.name == "tool_data_annotation";
  EXPECT_GT(n, 10);
  // Paths that used to be refused are no concern of the server now: still nothing written.
  g = Call(Request(20, "/etc/plugins/profile", "s", "h"), &resp);
  EXPECT_TRUE(g.ok()) << g.error_message();
  EXPECT_FALSE(fs::exists("/etc/plugins/profile/s/h.xplane.pb"));
}

// SPYGLASS_ALLOWED_LOG_ROOT sets allowed_log_root when the options leave it empty.
TEST_F(ServerTest, AllowedLogRootFromTheEnvironment) {
  ASSERT_TRUE(prof::stop_server().ok());
  std::string allowed = MakeTempDir();
  setenv(prof::kEnvAllowedLogRoot, allowed.c_str(), 1);
  Status s = prof::start_server(port_);
  unsetenv(prof::kEnvAllowedLogRoot);
  ASSERT_TRUE(s.ok()) << s.ToString();
  grpc::Status g = Call(Request(20, allowed + "/plugins/profile", "s", "h"));
  EXPECT_TRUE(g.ok()) << g.error_message();
  EXPECT_TRUE(fs::is_regular_file(allowed + "/plugins/profile/s/h.xplane.pb"));
  g = Call(Request(20, MakeTempDir() + "/plugins/profile", "s", "h"));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(g.error_message().find("outside"), std::string::npos) << g.error_message();
  ASSERT_TRUE(prof::stop_server().ok());
  setenv(prof::kEnvAllowedLogRoot, "relative/dir", 1);
  s = prof::start_server(port_);
  unsetenv(prof::kEnvAllowedLogRoot);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(prof::kEnvAllowedLogRoot), std::string::npos) << s.message();
  ASSERT_TRUE(prof::start_server(port_).ok());  // for TearDown
}

TEST_F(ServerTest, ServerWritesFileWhenNotEmittingXSpace) {
  Annotator a;
  std::string dir = MakeTempDir();
  ASSERT_TRUE(prof::stop_server().ok());
  prof::ServerOptions o;
  o.allowed_log_root = dir;
  ASSERT_TRUE(prof::start_server(port_, o).ok());
  tensorflow::ProfileResponse resp;
  grpc::Status g = Call(Request(100, dir + "/plugins/profile", "run1", "myhost:1234"), &resp);
  ASSERT_TRUE(g.ok()) << g.error_message();
  EXPECT_FALSE(resp.empty_trace());
  EXPECT_FALSE(resp.has_xspace());
  EXPECT_TRUE(fs::is_regular_file(dir + "/plugins/profile/run1/myhost_1234.xplane.pb"));
}

TEST_F(ServerTest, EmptyTraceIsReported) {
  tensorflow::ProfileRequest r = Request(50, "", "e", "h");
  r.set_emit_xspace(true);
  tensorflow::ProfileResponse resp;
  ASSERT_TRUE(Call(r, &resp).ok());
  EXPECT_TRUE(resp.empty_trace());
  EXPECT_TRUE(resp.has_xspace());
}

TEST_F(ServerTest, RejectsPathTricks) {
  ASSERT_TRUE(prof::stop_server().ok());
  prof::ServerOptions o;
  o.allowed_log_root = "/";  // the server writes, anywhere the rules allow
  ASSERT_TRUE(prof::start_server(port_, o).ok());
  std::string dir = MakeTempDir();
  std::string outside = MakeTempDir("spyglass-outside");
  fs::create_directories(dir + "/real/plugins");
  fs::create_symlink(outside, dir + "/real/plugins/profile");       // the root itself is a link
  fs::create_directories(dir + "/ok/plugins/profile");
  fs::create_symlink(outside, dir + "/ok/plugins/profile/linked");  // session dir is a link
  fs::create_symlink(outside, dir + "/linkdir");                    // a parent is a link
  fs::create_directories(outside + "/plugins/profile");
  struct Case {
    std::string root, session, host, expect;
  } cases[] = {
      {"relative/plugins/profile", "s", "h", "absolute"},
      {dir + "/plugins/profile/../../../etc/plugins/profile", "s", "h", "'..'"},
      {dir + "/x/./plugins/profile", "s", "h", "'.'"},
      {dir + "/not_profile", "s", "h", "plugins/profile"},
      {"/etc", "s", "h", "plugins/profile"},
      {dir + "/ok/plugins/profile", "..", "h", "session_id"},
      {dir + "/ok/plugins/profile", "../../x", "h", "session_id"},
      {dir + "/ok/plugins/profile", "/abs", "h", "session_id"},
      {dir + "/ok/plugins/profile", "s", "../../../etc/passwd", "host name"},
      {dir + "/ok/plugins/profile", "s", "..", "host name"},
      {dir + "/ok/plugins/profile", "linked", "h", "symbolic link"},
      {dir + "/real/plugins/profile", "s", "h", "symbolic link"},
      {dir + "/linkdir/plugins/profile", "s", "h", "symbolic link"},
      {"", "s", "h", "empty"},
  };
  for (const Case& c : cases) {
    grpc::Status g = Call(Request(20, c.root, c.session, c.host));
    EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.root << " " << c.session << " " << c.host;
    EXPECT_NE(g.error_message().find(c.expect), std::string::npos) << g.error_message();
  }
  // Nothing was written outside, nor through the links.
  EXPECT_TRUE(fs::is_empty(outside + "/plugins/profile"));
  size_t entries = 0;
  for (auto it = fs::recursive_directory_iterator(outside); it != fs::recursive_directory_iterator(); ++it) ++entries;
  EXPECT_EQ(entries, 2u);  // plugins, plugins/profile
  EXPECT_FALSE(fs::exists(dir + "/ok/plugins/profile/s"));
}

TEST_F(ServerTest, AllowedLogRootConfinesWrites) {
  ASSERT_TRUE(prof::stop_server().ok());
  std::string allowed = MakeTempDir();
  prof::ServerOptions o;
  o.allowed_log_root = allowed;
  ASSERT_TRUE(prof::start_server(port_, o).ok());
  std::string other = MakeTempDir();
  grpc::Status g = Call(Request(20, other + "/plugins/profile", "s", "h"));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(g.error_message().find("outside"), std::string::npos) << g.error_message();
  g = Call(Request(20, allowed + "/logs/plugins/profile", "s", "h"));
  EXPECT_TRUE(g.ok()) << g.error_message();
  EXPECT_TRUE(fs::exists(allowed + "/logs/plugins/profile/s/h.xplane.pb"));
}

TEST_F(ServerTest, BadDurations) {
  auto r = Request(0, "", "s", "h");
  r.set_emit_xspace(true);
  grpc::Status g = Call(r);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(g.error_message().find("duration"), std::string::npos);
  r = Request(2 * 3600 * 1000, "", "s", "h");
  r.set_emit_xspace(true);
  g = Call(r);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(g.error_message().find("limit"), std::string::npos);
  // Client side: zero and absurd durations never reach a server.
  server::CaptureOptions o;
  server::CaptureResult res;
  std::string dir = MakeTempDir();
  EXPECT_EQ(server::Capture({address_}, o, dir, &res).code(), StatusCode::kInvalidArgument);
  o.duration_ms = 5 * 3600 * 1000ull;
  EXPECT_EQ(server::Capture({address_}, o, dir, &res).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(server::Capture({"nonsense"}, o, dir, &res).code(), StatusCode::kInvalidArgument);
}

TEST_F(ServerTest, SecondCaptureIsRejectedFirstUndisturbed) {
  Annotator a("first_capture");
  auto r1 = Request(600, "", "first", "h");
  r1.set_emit_xspace(true);
  tensorflow::ProfileResponse resp1;
  grpc::Status g1;
  std::thread first([&] { g1 = Call(r1, &resp1); });
  std::this_thread::sleep_for(200ms);
  auto r2 = Request(100, "", "second", "h");
  r2.set_emit_xspace(true);
  grpc::Status g2 = Call(r2);
  EXPECT_EQ(g2.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(g2.error_message().find("already profiling"), std::string::npos) << g2.error_message();
  // start_trace meanwhile fails too.
  EXPECT_EQ(prof::start_trace(MakeTempDir()).code(), StatusCode::kFailedPrecondition);
  first.join();
  ASSERT_TRUE(g1.ok()) << g1.error_message();
  EXPECT_FALSE(resp1.empty_trace());
  // And a capture while start_trace runs.
  ASSERT_TRUE(prof::start_trace(MakeTempDir()).ok());
  g2 = Call(r2);
  EXPECT_EQ(g2.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(prof::stop_trace().ok());
}

TEST_F(ServerTest, ClientDisconnectStopsRecording) {
  auto r = Request(30000, "", "long", "h");
  r.set_emit_xspace(true);
  auto t0 = std::chrono::steady_clock::now();
  grpc::Status g = Call(r, nullptr, 300ms);  // the client gives up after 300 ms
  EXPECT_EQ(g.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  while (session::SessionActive() && SecondsSince(t0) < 5) std::this_thread::sleep_for(5ms);
  EXPECT_FALSE(session::SessionActive());
  EXPECT_LT(SecondsSince(t0), 2.0);
}

TEST_F(ServerTest, TerminateEndsUntilTerminateCapture) {
  Annotator a;
  auto r = Request(std::numeric_limits<uint64_t>::max(), "", "sub_1", "h");
  r.set_emit_xspace(true);
  tensorflow::ProfileResponse resp;
  grpc::Status g;
  auto t0 = std::chrono::steady_clock::now();
  std::thread t([&] { g = Call(r, &resp); });
  std::this_thread::sleep_for(200ms);
  grpc::ClientContext ctx;
  tensorflow::TerminateRequest tr;
  tr.set_session_id("sub_1");
  tensorflow::TerminateResponse tresp;
  EXPECT_TRUE(stub_->Terminate(&ctx, tr, &tresp).ok());
  t.join();
  EXPECT_TRUE(g.ok()) << g.error_message();
  EXPECT_TRUE(resp.has_xspace());
  EXPECT_FALSE(resp.empty_trace());
  EXPECT_LT(SecondsSince(t0), 3.0);
}

TEST_F(ServerTest, MonitorIsUnimplemented) {
  grpc::ClientContext ctx;
  tensorflow::MonitorRequest r;
  tensorflow::MonitorResponse resp;
  EXPECT_EQ(stub_->Monitor(&ctx, r, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(ClientTest, DeadPeersFailQuicklyAndClearly) {
  std::string dir = MakeTempDir();
  server::CaptureOptions o;
  o.duration_ms = 100;
  o.connect_timeout_ms = 1500;
  server::CaptureResult res;
  // Closed port.
  int port = 0;
  close(ListenSocket(&port));
  auto t0 = std::chrono::steady_clock::now();
  Status s = server::Capture({"127.0.0.1:" + std::to_string(port)}, o, dir, &res);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot connect"), std::string::npos) << s.ToString();
  EXPECT_LT(SecondsSince(t0), 3.0);
  // A listener that never answers (accepts at the kernel level, never speaks).
  int silent = ListenSocket(&port);
  t0 = std::chrono::steady_clock::now();
  s = server::Capture({"127.0.0.1:" + std::to_string(port)}, o, dir, &res);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == StatusCode::kDeadlineExceeded || s.code() == StatusCode::kUnavailable) << s.ToString();
  EXPECT_LT(SecondsSince(t0), 5.0);
  close(silent);
  // A server that is not a profiler server: answers with HTTP/1.1 garbage.
  int http = ListenSocket(&port);
  std::thread responder([http] {
    for (int i = 0; i < 8; ++i) {
      int c = accept(http, nullptr, nullptr);
      if (c < 0) return;
      const char reply[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      (void)!write(c, reply, sizeof reply - 1);
      close(c);
    }
  });
  t0 = std::chrono::steady_clock::now();
  s = server::Capture({"127.0.0.1:" + std::to_string(port)}, o, dir, &res);
  EXPECT_FALSE(s.ok());
  EXPECT_LT(SecondsSince(t0), 5.0);
  shutdown(http, SHUT_RDWR);
  close(http);
  responder.join();
}

TEST(ClientTest, CliFailsWithNonZeroExitOnClosedPort) {
  int port = 0;
  close(ListenSocket(&port));
  std::string cmd = std::string(SPYGLASS_CLI) + " collect " + std::to_string(port) +
                    " 200 --no_perfetto_link --connect_timeout_ms 1500 --log_dir " + MakeTempDir() + " 2>&1";
  auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int rc = pclose(p);
  EXPECT_NE(WEXITSTATUS(rc), 0) << out;
  EXPECT_NE(out.find("cannot connect"), std::string::npos) << out;
  EXPECT_LT(SecondsSince(t0), 5.0);
  // Bad durations.
  for (const char* d : {"0", "-5", "99999999999"}) {
    std::string c2 = std::string(SPYGLASS_CLI) + " collect " + std::to_string(port) + " " + d +
                     " --no_perfetto_link 2>&1";
    p = popen(c2.c_str(), "r");
    out.clear();
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    EXPECT_NE(WEXITSTATUS(pclose(p)), 0) << d << ": " << out;
    EXPECT_NE(out.find("duration"), std::string::npos) << out;
  }
}

// Runs a shell command; returns its exit status and its stdout+stderr in *out.
int RunCommand(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out->append(buf, n);
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

// The run directories under <log_dir>/plugins/profile.
std::vector<fs::path> RunDirs(const std::string& log_dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(log_dir) / "plugins" / "profile", ec))
    if (e.is_directory()) out.push_back(e.path());
  return out;
}

// File names in a directory ending in `suffix`, sorted.
std::vector<std::string> FilesEndingIn(const fs::path& dir, const std::string& suffix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Task Environment's [profile_start_time, profile_stop_time] (wall ns), {0,0} if absent.
std::pair<uint64_t, uint64_t> ProfileWindow(const tensorflow::profiler::XSpace& space) {
  const auto* env = FindPlane(space, "Task Environment");
  if (env == nullptr) return {0, 0};
  auto stats = spyglass::testing::PlaneStats(*env);
  if (!stats.count("profile_start_time") || !stats.count("profile_stop_time")) return {0, 0};
  return {std::stoull(stats["profile_start_time"]), std::stoull(stats["profile_stop_time"])};
}

// `spyglass collect a,b`: two processes captured in the same window, one file
// per address in one run directory, each with that process's own events.
TEST(ClientTest, CliCapturesSeveralHostsInOneWindow) {
  AnnotatingChild a({"--name", "multi_a_step"});
  AnnotatingChild b({"--name", "multi_b_step"});
  ASSERT_GT(a.port(), 0);
  ASSERT_GT(b.port(), 0);
  std::string dir = MakeTempDir();
  std::string addr_a = "127.0.0.1:" + std::to_string(a.port());
  std::string addr_b = "127.0.0.1:" + std::to_string(b.port());
  std::string out;
  int rc = RunCommand(std::string(SPYGLASS_CLI) + " collect " + addr_a + "," + addr_b +
                          " 500 --no_perfetto_link --log_dir " + dir,
                      &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("2 servers"), std::string::npos) << out;
  EXPECT_EQ(out.find("warning"), std::string::npos) << out;

  auto runs = RunDirs(dir);
  ASSERT_EQ(runs.size(), 1u) << out;
  const fs::path& run = runs[0];
  std::string stem_a = "127.0.0.1_" + std::to_string(a.port());
  std::string stem_b = "127.0.0.1_" + std::to_string(b.port());
  std::vector<std::string> expected = {stem_a + ".xplane.pb", stem_b + ".xplane.pb"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(FilesEndingIn(run, ".xplane.pb"), expected);
  std::vector<std::string> expected_json = {stem_a + ".trace.json.gz", stem_b + ".trace.json.gz"};
  std::sort(expected_json.begin(), expected_json.end());
  EXPECT_EQ(FilesEndingIn(run, ".trace.json.gz"), expected_json);
  EXPECT_FALSE(fs::exists(run / "perfetto_trace.pb"));  // --no_perfetto_link
  EXPECT_FALSE(fs::exists(run / "perfetto_trace.json.gz"));

  struct Host {
    const AnnotatingChild* child;
    std::string stem, own, other;
  } hosts[] = {{&a, stem_a, "multi_a_step", "multi_b_step"}, {&b, stem_b, "multi_b_step", "multi_a_step"}};
  std::vector<std::pair<uint64_t, uint64_t>> windows;
  for (const Host& h : hosts) {
    SCOPED_TRACE(h.stem);
    auto space = ReadXSpace((run / (h.stem + ".xplane.pb")).string());
    EXPECT_EQ(space.errors_size(), 0) << space.errors(0);
    const auto* host = FindPlane(space, "/host:CPU");
    ASSERT_NE(host, nullptr);
    // The file of this address holds this process: its pid, its annotation, not the other's.
    EXPECT_EQ(spyglass::testing::PlaneStats(*host)["process_id"], std::to_string(h.child->pid()));
    int own = 0, other = 0;
    for (const auto& e : Events(*host)) {
      own += e.name == h.own;
      other += e.name == h.other;
    }
    EXPECT_GT(own, 20);
    EXPECT_EQ(other, 0);
    std::string json = ReadGzip((run / (h.stem + ".trace.json.gz")).string());
    EXPECT_NE(json.find(h.own), std::string::npos);
    EXPECT_EQ(json.find(h.other), std::string::npos);
    auto w = ProfileWindow(space);
    ASSERT_GT(w.first, 0u);
    EXPECT_GT(w.second, w.first);
    // About the requested 500 ms.
    EXPECT_GE(w.second - w.first, 400'000'000u);
    EXPECT_LE(w.second - w.first, 5'000'000'000u);
    windows.push_back(w);
  }
  ASSERT_EQ(windows.size(), 2u);
  // Same window: the two recordings overlap, for most of the duration.
  uint64_t lo = std::max(windows[0].first, windows[1].first);
  uint64_t hi = std::min(windows[0].second, windows[1].second);
  ASSERT_LT(lo, hi) << "captures do not overlap: [" << windows[0].first << ", " << windows[0].second << "] vs ["
                    << windows[1].first << ", " << windows[1].second << "]";
  EXPECT_GE(hi - lo, 250'000'000u) << "overlap of only " << (hi - lo) / 1000000 << " ms";
}

// One live and one dead address: the live one is written, the dead one named,
// exit 0 (docs/remote-capture.md: non-zero only when no server returned events). Both dead: non-zero.
TEST(ClientTest, CliWithOneDeadHostWritesTheLiveOne) {
  AnnotatingChild live({"--name", "live_host_step"});
  ASSERT_GT(live.port(), 0);
  int dead_port = 0;
  close(ListenSocket(&dead_port));
  std::string addr_live = "127.0.0.1:" + std::to_string(live.port());
  std::string addr_dead = "127.0.0.1:" + std::to_string(dead_port);
  std::string dir = MakeTempDir();
  std::string out;
  auto t0 = std::chrono::steady_clock::now();
  int rc = RunCommand(std::string(SPYGLASS_CLI) + " collect " + addr_dead + "," + addr_live +
                          " 300 --no_perfetto_link --connect_timeout_ms 1500 --log_dir " + dir,
                      &out);
  EXPECT_LT(SecondsSince(t0), 10.0);
  EXPECT_EQ(rc, 0) << out;
  // The dead one is named, with the reason.
  EXPECT_NE(out.find("warning: capture from " + addr_dead + " failed"), std::string::npos) << out;
  EXPECT_NE(out.find("cannot connect to " + addr_dead), std::string::npos) << out;
  EXPECT_EQ(out.find("capture from " + addr_live + " failed"), std::string::npos) << out;

  auto runs = RunDirs(dir);
  ASSERT_EQ(runs.size(), 1u) << out;
  std::string stem_live = "127.0.0.1_" + std::to_string(live.port());
  std::string stem_dead = "127.0.0.1_" + std::to_string(dead_port);
  EXPECT_EQ(FilesEndingIn(runs[0], ".xplane.pb"), std::vector<std::string>{stem_live + ".xplane.pb"});
  EXPECT_FALSE(fs::exists(runs[0] / (stem_dead + ".trace.json.gz")));
  EXPECT_NE(out.find((runs[0] / (stem_live + ".xplane.pb")).string()), std::string::npos) << out;
  auto space = ReadXSpace((runs[0] / (stem_live + ".xplane.pb")).string());
  const auto* host = FindPlane(space, "/host:CPU");
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(spyglass::testing::PlaneStats(*host)["process_id"], std::to_string(live.pid()));
  int n = 0;
  for (const auto& e : Events(*host)) n += e.name == "live_host_step";
  EXPECT_GT(n, 20);

  // Both dead: non-zero, with a message naming each.
  int dead_port2 = 0;
  close(ListenSocket(&dead_port2));
  std::string addr_dead2 = "127.0.0.1:" + std::to_string(dead_port2);
  t0 = std::chrono::steady_clock::now();
  rc = RunCommand(std::string(SPYGLASS_CLI) + " collect " + addr_dead + "," + addr_dead2 +
                      " 300 --no_perfetto_link --connect_timeout_ms 1500 --log_dir " + MakeTempDir(),
                  &out);
  EXPECT_LT(SecondsSince(t0), 5.0);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("No trace event was collected"), std::string::npos) << out;
  EXPECT_NE(out.find("cannot connect to " + addr_dead), std::string::npos) << out;
  EXPECT_NE(out.find("cannot connect to " + addr_dead2), std::string::npos) << out;
}

// gRPC does not survive fork: a child forked after the parent served gets a
// clear error from start_server (not a port that never answers).
TEST(SubprocessTest, ForkAfterGrpcUseFailsClearlyInTheChild) {
  namespace prof = spyglass::profiler;
  ASSERT_TRUE(prof::start_server(0).ok());
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    spyglass::Status s = prof::start_server(0);
    bool ok = s.code() == spyglass::StatusCode::kFailedPrecondition &&
              s.message().find("forked") != std::string::npos && s.message().find("spawn") != std::string::npos;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(prof::stop_server().ok());
}

TEST(SubprocessTest, RegistrationErrors) {
  prof::SubprocessRegistration r;
  EXPECT_EQ(prof::register_subprocess(getpid(), 1234, &r).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(prof::register_subprocess(12345, 0, &r).code(), StatusCode::kInvalidArgument);
  int port = 0;
  close(ListenSocket(&port));
  Status s = prof::register_subprocess(999999, port, &r, 300);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  AnnotatingChild child;
  ASSERT_TRUE(prof::register_subprocess(child.pid(), child.port(), &r, 5000).ok());
  prof::SubprocessRegistration r2;
  EXPECT_EQ(prof::register_subprocess(child.pid(), child.port(), &r2, 5000).code(), StatusCode::kAlreadyExists);
  r();  // unregister
  EXPECT_FALSE(r.registered());
  EXPECT_TRUE(prof::register_subprocess(child.pid(), child.port(), &r2, 5000).ok());
}

TEST(SubprocessTest, CaptureMergesChildrenAndSurvivesADeadOne) {
  AnnotatingChild a({"--name", "child_a_step"});
  AnnotatingChild b({"--name", "child_b_step"});
  prof::SubprocessRegistration ra, rb;
  ASSERT_TRUE(prof::register_subprocess(a.pid(), a.port(), &ra, 5000).ok());
  ASSERT_TRUE(prof::register_subprocess(b.pid(), b.port(), &rb, 5000).ok());
  ASSERT_TRUE(prof::start_server(0).ok());
  std::string address = "127.0.0.1:" + std::to_string(prof::server_port());
  Annotator parent("parent_step");
  std::string dir = MakeTempDir();
  server::CaptureOptions o;
  o.duration_ms = 400;
  server::CaptureResult res;
  Status s = server::Capture({address}, o, dir, &res);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto space = ReadXSpace(res.hosts[0].xplane_path);
  for (auto [child, name] : {std::pair{&a, "child_a_step"}, std::pair{&b, "child_b_step"}}) {
    std::string plane = "/host:CPU [" + std::to_string(child->pid()) + "]";
    const auto* p = FindPlane(space, plane);
    ASSERT_NE(p, nullptr) << plane;
    int n = 0;
    for (const auto& e : Events(*p)) {
      if (e.name != name) continue;
      ++n;
      // One time base: the child's events lie within the parent's window.
      EXPECT_GE(e.start_ps, -50'000'000'000) << name;
      EXPECT_LE(e.start_ps, 2'000'000'000'000) << name;
    }
    EXPECT_GT(n, 20) << plane;
    EXPECT_NE(FindPlane(space, "Task Environment [" + std::to_string(child->pid()) + "]"), nullptr);
  }
  std::string json = ReadGzip(res.hosts[0].trace_json_path);
  EXPECT_NE(json.find("child_a_step"), std::string::npos);
  EXPECT_NE(json.find("\"pid\":" + std::to_string(b.pid())), std::string::npos);
  EXPECT_NE(json.find("parent_step"), std::string::npos);

  // A dead child: the capture finishes with the others and names it.
  int dead = b.pid();
  b.Kill();
  auto t0 = std::chrono::steady_clock::now();
  s = server::Capture({address}, o, dir, &res);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(SecondsSince(t0), 10.0);
  space = ReadXSpace(res.hosts[0].xplane_path);
  bool named = false;
  for (const auto& w : space.warnings()) named |= w.find(std::to_string(dead)) != std::string::npos;
  EXPECT_TRUE(named);
  EXPECT_NE(FindPlane(space, "/host:CPU [" + std::to_string(a.pid()) + "]"), nullptr);
  EXPECT_EQ(FindPlane(space, "/host:CPU [" + std::to_string(dead) + "]"), nullptr);

  // A child that does not answer (stopped): bounded, named, parent data kept.
  kill(a.pid(), SIGSTOP);
  t0 = std::chrono::steady_clock::now();
  s = server::Capture({address}, o, dir, &res);
  kill(a.pid(), SIGCONT);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(SecondsSince(t0), 10.0);
  space = ReadXSpace(res.hosts[0].xplane_path);
  named = false;
  for (const auto& w : space.warnings()) named |= w.find(std::to_string(a.pid())) != std::string::npos;
  EXPECT_TRUE(named);
  EXPECT_NE(FindPlane(space, "/host:CPU"), nullptr);

  // start_trace propagates too; profile_subprocesses=false turns it off.
  prof::TraceOptions t;
  t.profiler_options.advanced_configuration.insert_or_assign("profile_subprocesses", false);
  rb.unregister();
  ASSERT_TRUE(prof::start_trace(dir, t).ok());
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(prof::stop_trace().ok());
  space = ReadXSpace(prof::last_trace_files().xplane_path);
  EXPECT_EQ(FindPlane(space, "/host:CPU [" + std::to_string(a.pid()) + "]"), nullptr);
  ASSERT_TRUE(prof::start_trace(dir).ok());
  std::this_thread::sleep_for(200ms);
  ASSERT_TRUE(prof::stop_trace().ok());
  space = ReadXSpace(prof::last_trace_files().xplane_path);
  EXPECT_NE(FindPlane(space, "/host:CPU [" + std::to_string(a.pid()) + "]"), nullptr);
  (void)prof::stop_server();
}

}  // namespace
}  // namespace spyglass
