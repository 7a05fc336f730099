// Session semantics: one at a time, errors, options validation, outputs and
// their layout, bounded buffers, export retry.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <thread>

#include "spyglass/profiler.h"
#include "test_util.h"

namespace prof = spyglass::profiler;
using spyglass::StatusCode;
using spyglass::testing::Events;
using spyglass::testing::FindPlane;
using spyglass::testing::MakeTempDir;
using spyglass::testing::PlaneStats;
using spyglass::testing::ReadGzip;
using spyglass::testing::ReadXSpace;
namespace fs = std::filesystem;

namespace {

TEST(Session, SecondStartFailsAndFirstKeepsRecording) {
  std::string dir = MakeTempDir();
  ASSERT_TRUE(prof::start_trace(dir).ok());
  { prof::TraceAnnotation a("before_second_start"); }
  auto s = prof::start_trace(MakeTempDir());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "Profile has already been started. Only one profile may be run at a time.");
  { prof::TraceAnnotation a("after_second_start"); }
  ASSERT_TRUE(prof::stop_trace().ok());
  auto events = Events(*FindPlane(ReadXSpace(prof::last_trace_files().xplane_path), "/host:CPU"));
  EXPECT_EQ(events.size(), 2u);
}

TEST(Session, StopWithoutStartFails) {
  auto s = prof::stop_trace();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "No profile started");
}

TEST(Session, InvalidOptionsFailBeforeAnythingStarts) {
  struct Case {
    const char* what;
    prof::ProfileOptions options;
    const char* expect_in_message;
  };
  std::vector<Case> cases;
  {
    prof::ProfileOptions o;
    o.advanced_configuration.emplace("no_such_key", true);
    cases.push_back({"unknown key", o, "no_such_key"});
  }
  {
    prof::ProfileOptions o;
    o.advanced_configuration.emplace("profile_subprocesses", 1);
    cases.push_back({"wrong type", o, "profile_subprocesses"});
  }
  {
    prof::ProfileOptions o;
    o.advanced_configuration.emplace("tpu_trace_mode", "BOGUS");
    cases.push_back({"bad enum", o, "tpu_trace_mode"});
  }
  {
    prof::ProfileOptions o;
    o.host_tracer_level = 4;
    cases.push_back({"host level", o, "host_tracer_level"});
  }
  {
    prof::ProfileOptions o;
    o.device_tracer_level = -1;
    cases.push_back({"device level", o, "device_tracer_level"});
  }
  {
    prof::ProfileOptions o;
    o.python_tracer_level = 2;
    cases.push_back({"python level", o, "python_tracer_level"});
  }
  for (const Case& c : cases) {
    std::string dir = MakeTempDir();
    prof::TraceOptions t;
    t.profiler_options = c.options;
    auto s = prof::start_trace(dir, t);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(s.message().find(c.expect_in_message), std::string::npos) << c.what << ": " << s.message();
    EXPECT_FALSE(prof::TraceAnnotation::is_enabled()) << c.what;
    EXPECT_FALSE(fs::exists(fs::path(dir) / "plugins")) << c.what;
  }
  // Nothing was left half-started.
  ASSERT_TRUE(prof::start_trace(MakeTempDir()).ok());
  ASSERT_TRUE(prof::stop_trace().ok());
}

TEST(Session, KnownAdvancedKeysAreAccepted) {
  prof::TraceOptions t;
  t.profiler_options.advanced_configuration.emplace("profile_subprocesses", false);
  t.profiler_options.advanced_configuration.emplace("gpu_max_activity_api_events", 1024);
  t.profiler_options.advanced_configuration.emplace("tpu_trace_mode", "TRACE_ONLY_HOST");
  ASSERT_TRUE(prof::start_trace(MakeTempDir(), t).ok());
  ASSERT_TRUE(prof::stop_trace().ok());
}

TEST(Session, LayoutAndMetadataAsJaxWritesThem) {
  std::string dir = MakeTempDir();
  prof::set_metadata("user_key", "user_value");  // cleared by start_trace, as in JAX
  ASSERT_TRUE(prof::start_trace(dir).ok());
  prof::set_metadata("model", "mlp");
  { prof::TraceAnnotation a("x"); }
  ASSERT_TRUE(prof::stop_trace().ok());
  auto files = prof::last_trace_files();
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  EXPECT_EQ(fs::path(files.run_dir).parent_path(), fs::path(dir) / "plugins" / "profile");
  EXPECT_EQ(files.xplane_path, files.run_dir + "/" + host + ".xplane.pb");
  EXPECT_EQ(files.trace_json_path, files.run_dir + "/" + host + ".trace.json.gz");
  EXPECT_TRUE(files.perfetto_trace_path.empty());
  // Run name: YYYY_MM_DD_HH_MM_SS
  std::string run = fs::path(files.run_dir).filename();
  EXPECT_EQ(run.size(), 19u);
  EXPECT_EQ(run[4], '_');

  auto space = ReadXSpace(files.xplane_path);
  ASSERT_EQ(space.hostnames_size(), 1);
  EXPECT_EQ(space.hostnames(0), host);
  auto md = PlaneStats(*FindPlane(space, "/host:metadata"));
  EXPECT_EQ(md.at("spyglass_version"), spyglass::version());
  EXPECT_EQ(md.at("spyglass_format_version"), "1");  // readers refuse a newer one
  EXPECT_EQ(md.at("pid"), std::to_string(getpid()));
  EXPECT_NE(md.at("command_line").find("session_test"), std::string::npos);
  EXPECT_EQ(md.at("hostname"), host);
  EXPECT_EQ(md.at("model"), "mlp");
  EXPECT_EQ(md.count("user_key"), 0u);
  auto env = PlaneStats(*FindPlane(space, "Task Environment"));
  uint64_t start = std::stoull(env.at("profile_start_time")), stop = std::stoull(env.at("profile_stop_time"));
  EXPECT_GT(start, 1'600'000'000'000'000'000ull);
  EXPECT_GE(stop, start);
  for (const auto& p : space.planes()) EXPECT_EQ(PlaneStats(p).at("process_id"), std::to_string(getpid())) << p.name();
  auto host_stats = PlaneStats(*FindPlane(space, "/host:CPU"));
  EXPECT_EQ(host_stats.at("dropped_events"), "0");
  EXPECT_FALSE(host_stats.at("process_name").empty());
}

TEST(Session, TwoRunsInTheSameSecondGetDistinctDirectories) {
  std::string dir = MakeTempDir();
  std::set<std::string> runs;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(prof::start_trace(dir).ok());
    ASSERT_TRUE(prof::stop_trace().ok());
    runs.insert(prof::last_trace_files().run_dir);
  }
  EXPECT_EQ(runs.size(), 3u);
}

TEST(Session, SessionIdNamesTheRun) {
  std::string dir = MakeTempDir();
  prof::TraceOptions t;
  t.profiler_options.session_id = "my_custom_session_123";
  ASSERT_TRUE(prof::start_trace(dir, t).ok());
  ASSERT_TRUE(prof::stop_trace().ok());
  EXPECT_EQ(prof::last_trace_files().run_dir, dir + "/plugins/profile/my_custom_session_123");
  t.profiler_options.session_id = "../escape";
  ASSERT_TRUE(prof::start_trace(dir, t).ok());
  auto s = prof::stop_trace();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("session_id"), std::string::npos) << s.message();
}

TEST(Session, PerfettoTraceOnRequest) {
  std::string dir = MakeTempDir();
  prof::TraceOptions t;
  t.create_perfetto_trace = true;
  ASSERT_TRUE(prof::start_trace(dir, t).ok());
  { prof::TraceAnnotation a("for_perfetto"); }
  ASSERT_TRUE(prof::stop_trace().ok());
  auto files = prof::last_trace_files();
  EXPECT_EQ(files.perfetto_trace_path, files.run_dir + "/perfetto_trace.pb");
  std::string pb = spyglass::testing::ReadFile(files.perfetto_trace_path);
  ASSERT_FALSE(pb.empty());
  EXPECT_EQ(pb[0], '\x0a');  // Trace.packet: how Perfetto recognizes a proto trace
  EXPECT_NE(pb.find("for_perfetto"), std::string::npos);  // an interned event name
  EXPECT_EQ(files.perfetto_trace_json_path, files.run_dir + "/perfetto_trace.json.gz");  // JAX's name
  EXPECT_NE(ReadGzip(files.perfetto_trace_json_path).find("for_perfetto"), std::string::npos);
}

// The trace JSON is formatted and written once per stop: JAX's
// perfetto_trace.json.gz is a hard link to <host>.trace.json.gz (one inode),
// beside the native perfetto_trace.pb.
TEST(Session, PerfettoTraceWritesTheJsonOnce) {
  std::string dir = MakeTempDir();
  prof::TraceOptions t;
  t.create_perfetto_trace = true;
  ASSERT_TRUE(prof::start_trace(dir, t).ok());
  { prof::TraceAnnotation a("once"); }
  ASSERT_TRUE(prof::stop_trace().ok());
  auto files = prof::last_trace_files();
  std::set<std::string> names, json;
  for (const auto& entry : fs::directory_iterator(files.run_dir)) {
    const std::string name = entry.path().filename().string();
    names.insert(name);
    if (name.find(".json") != std::string::npos) json.insert(name);
  }
  // .xplane.pb, .trace.json.gz, perfetto_trace.json.gz, perfetto_trace.pb
  EXPECT_EQ(names.size(), 4u) << ::testing::PrintToString(names);
  EXPECT_EQ(json.size(), 2u) << ::testing::PrintToString(names);
  EXPECT_TRUE(names.count("perfetto_trace.pb")) << ::testing::PrintToString(names);
  EXPECT_EQ(files.perfetto_trace_json_path, files.run_dir + "/perfetto_trace.json.gz");
  struct stat host_json {}, perfetto_json {};
  ASSERT_EQ(::stat(files.trace_json_path.c_str(), &host_json), 0);
  ASSERT_EQ(::lstat(files.perfetto_trace_json_path.c_str(), &perfetto_json), 0);
  EXPECT_TRUE(S_ISREG(perfetto_json.st_mode));
  EXPECT_EQ(perfetto_json.st_ino, host_json.st_ino);  // the same file: its bytes written once
  EXPECT_EQ(host_json.st_nlink, 2u);
}

// A symbolic link planted at perfetto_trace.json.gz in the run directory is
// refused, its target untouched.
TEST(Session, PerfettoTraceJsonRefusesAPlantedLink) {
  std::string dir = MakeTempDir(), outside = MakeTempDir("spyglass-outside");
  fs::create_directories(dir + "/plugins/profile/planted");
  std::ofstream(outside + "/precious") << "precious";
  fs::create_symlink(outside + "/precious", dir + "/plugins/profile/planted/perfetto_trace.json.gz");
  prof::TraceOptions t;
  t.create_perfetto_trace = true;
  t.profiler_options.session_id = "planted";
  ASSERT_TRUE(prof::start_trace(dir, t).ok());
  { prof::TraceAnnotation a("planted"); }
  spyglass::Status s = prof::stop_trace();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s.ToString();
  EXPECT_EQ(spyglass::testing::ReadFile(outside + "/precious"), "precious");
  EXPECT_TRUE(fs::is_symlink(dir + "/plugins/profile/planted/perfetto_trace.json.gz"));
}

// HTTP GET against the Perfetto link server; returns the whole response.
std::string HttpGet(int port, const std::string& path) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
      (void)!write(fd, req.data(), req.size());
      std::string resp;
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) resp.append(buf, n);
      close(fd);
      return resp;
    }
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return {};
}

TEST(Session, PerfettoLinkServesTheTraceOnceThenReturns) {
  std::string dir = MakeTempDir();
  prof::TraceOptions t;
  t.create_perfetto_link = true;
  t.perfetto_link_timeout_s = 30;
  ASSERT_TRUE(prof::start_trace(dir, t).ok());
  { prof::TraceAnnotation a("served_event"); }
  spyglass::Status stopped;
  std::thread stopper([&] { stopped = prof::stop_trace(); });
  std::string other = HttpGet(9001, "/../../etc/passwd");
  EXPECT_NE(other.find(" 404 "), std::string::npos);
  std::string resp = HttpGet(9001, "/perfetto_trace.json.gz");  // JAX's URL
  stopper.join();
  EXPECT_TRUE(stopped.ok()) << stopped.ToString();
  EXPECT_NE(resp.find(" 200 "), std::string::npos);
  EXPECT_NE(resp.find("Access-Control-Allow-Origin: *"), std::string::npos);
  std::string body = resp.substr(resp.find("\r\n\r\n") + 4);
  EXPECT_EQ(body, spyglass::testing::ReadFile(prof::last_trace_files().perfetto_trace_json_path));
  EXPECT_TRUE(fs::exists(prof::last_trace_files().perfetto_trace_path));  // the native trace beside it
}

TEST(Session, UnwritableLogDirFailsAndDataCanBeExportedAgain) {
  if (geteuid() == 0) {
    // root ignores permissions; a file in place of a directory still fails.
  }
  std::string base = MakeTempDir();
  std::string blocker = base + "/not_a_dir";
  std::ofstream(blocker) << "x";
  ASSERT_TRUE(prof::start_trace(blocker).ok());
  { prof::TraceAnnotation a("precious"); }
  auto s = prof::stop_trace();
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("not_a_dir"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("export_last_trace"), std::string::npos) << s.message();
  // The session is over (a new one may start) and the data is kept.
  std::string good = MakeTempDir();
  ASSERT_TRUE(prof::export_last_trace(good).ok());
  auto events = Events(*FindPlane(ReadXSpace(prof::last_trace_files().xplane_path), "/host:CPU"));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].name, "precious");
  ASSERT_TRUE(prof::start_trace(good).ok());
  ASSERT_TRUE(prof::stop_trace().ok());
}

TEST(Session, ReadOnlyDirectoryFails) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  std::string base = MakeTempDir();
  chmod(base.c_str(), 0555);
  ASSERT_TRUE(prof::start_trace(base).ok());
  auto s = prof::stop_trace();
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  chmod(base.c_str(), 0755);
}

TEST(Session, BoundedBuffersDropAndCount) {
  prof::TraceOptions t;
  t.profiler_options.buffer_bytes_per_thread = 128 * 1024;  // one chunk
  ASSERT_TRUE(prof::start_trace(MakeTempDir(), t).ok());
  for (int i = 0; i < 100000; ++i) prof::TraceAnnotation a("flood");
  ASSERT_TRUE(prof::stop_trace().ok());
  auto stats = prof::last_trace_stats();
  EXPECT_GT(stats.dropped_events, 0u);
  EXPECT_EQ(stats.events + stats.dropped_events, 100000u);
  EXPECT_LE(stats.events * 24, 128u * 1024);  // 24 bytes per static-name event
  auto space = ReadXSpace(prof::last_trace_files().xplane_path);
  EXPECT_EQ(PlaneStats(*FindPlane(space, "/host:CPU")).at("dropped_events"), std::to_string(stats.dropped_events));
  ASSERT_GE(space.warnings_size(), 1);
  EXPECT_NE(space.warnings(0).find("dropped"), std::string::npos);
  std::string json = ReadGzip(prof::last_trace_files().trace_json_path);
  EXPECT_NE(json.find("events dropped"), std::string::npos);
}

TEST(Session, TotalBoundAsAdvancedKey) {
  prof::TraceOptions t;
  t.profiler_options.advanced_configuration.emplace("spyglass_buffer_bytes_total", 256 * 1024);
  ASSERT_TRUE(prof::start_trace(MakeTempDir(), t).ok());
  auto flood = [] {
    for (int i = 0; i < 50000; ++i) prof::TraceAnnotation a("flood");
  };
  std::thread a(flood), b(flood), c(flood);
  a.join();
  b.join();
  c.join();
  ASSERT_TRUE(prof::stop_trace().ok());
  auto stats = prof::last_trace_stats();
  EXPECT_GT(stats.dropped_events, 0u);
  EXPECT_EQ(stats.events + stats.dropped_events, 150000u);
  EXPECT_LE(stats.events * 24, 256u * 1024);
}

TEST(Session, TraceScopeStopsAtScopeExit) {
  std::string dir = MakeTempDir();
  {
    auto scope = prof::trace(dir);
    ASSERT_TRUE(scope.ok());
    prof::TraceAnnotation a("in_scope");
  }
  EXPECT_FALSE(prof::TraceAnnotation::is_enabled());
  EXPECT_TRUE(fs::exists(prof::last_trace_files().xplane_path));
  {
    auto scope = prof::trace(dir);
    auto second = prof::trace(dir);
    EXPECT_FALSE(second.ok());
    EXPECT_TRUE(scope.stop().ok());
  }
}

}  // namespace
