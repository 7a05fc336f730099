// The flight recorder: the ring keeps exactly its window (event counts and
// times), counts what it overwrote, stays within its memory budget, and each
// trigger (API, signal, slow step, crash) writes a run that reads back.
// XProf's converter reads these runs in flight_recorder_xprof_test.sh.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "common/clock.h"
#include "process_memory.h"
#include "server/client.h"
#include "session/session.h"
#include "spyglass/profiler.h"
#include "test_util.h"
#include "trace/host_collector.h"
#include "trace/recorder.h"

namespace prof = spyglass::profiler;
namespace in = spyglass::internal;
namespace model = spyglass::model;
using spyglass::StatusCode;
using spyglass::testing::Events;
using spyglass::testing::FindPlane;
using spyglass::testing::MakeTempDir;
using spyglass::testing::PlaneStats;
using spyglass::testing::ReadXSpace;
namespace fs = std::filesystem;

namespace {

// The events of a plane named `name`, with their "seq" argument, in seq order.
std::vector<std::pair<int64_t, int64_t>> SeqsAndStarts(const model::Plane& plane, std::string_view name) {
  std::vector<std::pair<int64_t, int64_t>> out;  // (seq, start ps)
  for (const model::Line& l : plane.lines)
    for (const model::Event& e : l.events) {
      if (plane.event_metadata()[e.metadata_id].name != name) continue;
      for (const model::Stat& s : l.stats_of(e))
        if (plane.stat_name(s) == "seq") out.emplace_back(s.i64, l.timestamp_ns * 1000 + e.offset_ps);
    }
  std::sort(out.begin(), out.end());
  return out;
}

prof::TraceOptions Ring(uint64_t seconds, uint64_t bytes) {
  prof::TraceOptions t;
  t.profiler_options.ring_buffer_seconds = seconds;
  t.profiler_options.ring_buffer_bytes = bytes;
  return t;
}

std::vector<std::string> Runs(const std::string& log_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(log_dir + "/plugins/profile", ec))
    if (e.is_directory()) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string XPlaneIn(const std::string& run) {
  for (const auto& e : fs::directory_iterator(run))
    if (e.path().string().ends_with(".xplane.pb")) return e.path().string();
  return {};
}

// Waits (bounded) until log_dir holds `n` runs with their .xplane.pb.
bool WaitForRuns(const std::string& log_dir, size_t n) {
  for (int i = 0; i < 600; ++i) {
    auto runs = Runs(log_dir);
    if (runs.size() >= n && !XPlaneIn(runs.back()).empty()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The window is cut in ticks: a snapshot from the tick read just before event
// k holds exactly events k.. (nothing before, nothing lost), at their times.
TEST(FlightRecorder, SnapshotKeepsExactlyTheEventsOfItsWindow) {
  in::init_clock();
  uint64_t start = in::now_ticks();
  uint64_t word = in::recorder_start(1, {8 << 20, 8 << 20, true});
  constexpr int kEvents = 1000, kFirst = 600;
  std::vector<uint64_t> before(kEvents);
  for (int i = 0; i < kEvents; ++i) {
    before[i] = in::now_ticks();
    prof::TraceAnnotation a("tick", {{"seq", i}});
  }
  uint64_t now = in::now_ticks();
  in::TickConverter clock = in::TickConverter::Calibrate();
  model::Plane plane;
  in::HostCollectStats stats =
      in::CollectHostEvents(in::recorder_snapshot(word, before[kFirst]), before[kFirst], now, clock, &plane,
                            before[kFirst]);
  // Recording goes on after the snapshot.
  { prof::TraceAnnotation a("after", {{"seq", kEvents}}); }
  in::recorder_stop();
  auto raw = in::recorder_collect(word);
  model::Plane all;
  in::CollectHostEvents(raw, start, in::now_ticks(), clock, &all);
  in::recorder_release(word);

  auto got = SeqsAndStarts(plane, "tick");
  ASSERT_EQ(got.size(), size_t{kEvents - kFirst});
  EXPECT_EQ(stats.overwritten, 0u);
  EXPECT_EQ(stats.held_since_ticks, 0u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, kFirst + static_cast<int64_t>(i));
    // Its start is at least the time from the window start to the tick read before it.
    int64_t floor_ps = clock.ns_between(before[kFirst], before[kFirst + i]) * 1000;
    EXPECT_GE(got[i].second, floor_ps);
    if (kFirst + i + 1 < kEvents) EXPECT_LE(got[i].second, clock.ns_between(before[kFirst], before[kFirst + i + 1]) * 1000);
  }
  EXPECT_EQ(SeqsAndStarts(all, "tick").size(), size_t{kEvents});
  EXPECT_EQ(SeqsAndStarts(all, "after").size(), 1u);
}

// With a ring of two chunks, the oldest are overwritten: what is held is the
// newest events, contiguous, and held + overwritten is every event.
TEST(FlightRecorder, OverwrittenCountIsExact) {
  in::init_clock();
  uint64_t start = in::now_ticks();
  uint64_t word = in::recorder_start(1, {2 * in::kChunkBytes, 2 * in::kChunkBytes, true});
  constexpr int kEvents = 100000;  // 48 bytes each: 4.6 MB through a 256 KiB ring
  for (int i = 0; i < kEvents; ++i) prof::TraceAnnotation a("tick", {{"seq", i}});
  uint64_t now = in::now_ticks();
  in::TickConverter clock = in::TickConverter::Calibrate();
  model::Plane plane;
  in::HostCollectStats stats = in::CollectHostEvents(in::recorder_snapshot(word, start), start, now, clock, &plane, start);
  in::recorder_stop();
  (void)in::recorder_collect(word);
  in::recorder_release(word);

  auto got = SeqsAndStarts(plane, "tick");
  ASSERT_FALSE(got.empty());
  EXPECT_GT(stats.overwritten, 0u);
  EXPECT_EQ(got.size() + stats.overwritten, size_t{kEvents});
  EXPECT_EQ(got.back().first, kEvents - 1);
  EXPECT_EQ(got.front().first, static_cast<int64_t>(stats.overwritten));
  EXPECT_LE(got.size() * 48, 2 * in::kChunkBytes);
  EXPECT_GT(stats.held_since_ticks, start);  // the ring says it lost part of the window
}

// Snapshots while threads overwrite a small ring: every snapshot holds, per
// thread, a contiguous run of its events (nothing torn, nothing dropped).
TEST(FlightRecorder, SnapshotsWhileThreadsOverwrite) {
  in::init_clock();
  uint64_t start = in::now_ticks();
  uint64_t word = in::recorder_start(1, {8 * in::kChunkBytes, 8 * in::kChunkBytes, true});
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int64_t i = 0; !stop.load(std::memory_order_relaxed) && i < 50'000'000; ++i) {
        prof::TraceAnnotation outer("outer", {{"seq", i}});
        if (i % 7 == 0) prof::TraceAnnotation inner(std::string_view(t % 2 ? "copied name" : "other"));
      }
    });
  in::TickConverter clock = in::TickConverter::Calibrate();
  uint64_t overwritten = 0;
  for (int k = 0; k < 30; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    model::Plane plane;
    in::HostCollectStats stats =
        in::CollectHostEvents(in::recorder_snapshot(word, start), start, in::now_ticks(), clock, &plane, start);
    EXPECT_EQ(stats.dropped, 0u);
    EXPECT_GE(stats.overwritten, overwritten);
    overwritten = stats.overwritten;
    for (const model::Line& l : plane.lines) {
      std::vector<int64_t> seqs;
      for (const model::Event& e : l.events)
        for (const model::Stat& st : l.stats_of(e))
          if (plane.stat_name(st) == "seq") seqs.push_back(st.i64);
      for (size_t i = 1; i < seqs.size(); ++i) ASSERT_EQ(seqs[i], seqs[i - 1] + 1) << "line " << l.name;
    }
  }
  stop = true;
  for (auto& t : threads) t.join();
  in::recorder_stop();
  (void)in::recorder_collect(word);
  in::recorder_release(word);
  EXPECT_GT(overwritten, 0u);
}

// The public API at a known rate: one event per ~200 us for 1.6 s, a ring of
// 1 s. The dump holds exactly the events begun inside its window (its Task
// Environment bounds), each at its time; the recorder runs on.
TEST(FlightRecorder, DumpWritesTheLastSecondsAndRunsOn) {
  std::string dir = MakeTempDir();
  ASSERT_TRUE(prof::start_trace(dir, Ring(1, 16 << 20)).ok());
  EXPECT_TRUE(prof::flight_recorder_active());
  struct Ev {
    uint64_t before, after;  // wall ns
  };
  std::vector<Ev> evs;
  evs.reserve(20000);
  uint64_t t0 = in::wall_ns();
  for (int i = 0; in::wall_ns() - t0 < 1'600'000'000ull && i < 20000; ++i) {
    uint64_t b = in::wall_ns();
    { prof::TraceAnnotation a("tick", {{"seq", i}}); }
    evs.push_back({b, in::wall_ns()});
    while (in::wall_ns() - b < 200'000) {
    }
  }
  ASSERT_TRUE(prof::dump_flight_recorder().ok());
  EXPECT_TRUE(prof::flight_recorder_active());
  std::string first_run = prof::last_trace_files().run_dir;
  { prof::TraceAnnotation a("after_dump"); }

  auto space = ReadXSpace(prof::last_trace_files().xplane_path);
  auto env = PlaneStats(*FindPlane(space, "Task Environment"));
  uint64_t w0 = std::stoull(env.at("profile_start_time")), w1 = std::stoull(env.at("profile_stop_time"));
  EXPECT_NEAR(static_cast<double>(w1 - w0), 1e9, 5e6);  // the window asked for
  const auto* host = FindPlane(space, "/host:CPU");
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(PlaneStats(*host).at("overwritten_events"), "0");
  std::map<int64_t, int64_t> got;  // seq -> start ps from w0
  for (const auto& e : Events(*host))
    if (e.name == "tick") got[std::stoll(e.stats.at("seq"))] = e.start_ps;
  ASSERT_FALSE(got.empty());
  constexpr uint64_t kMargin = 2'000'000;  // ns: tick/wall conversion and clock reads
  size_t expected = 0;
  for (size_t i = 0; i < evs.size(); ++i) {
    if (evs[i].before >= w0 + kMargin) {
      ++expected;
      ASSERT_TRUE(got.count(i)) << "event " << i << " began inside the window but is missing";
      int64_t at_ns = got[i] / 1000 + static_cast<int64_t>(w0);
      EXPECT_GE(at_ns, static_cast<int64_t>(evs[i].before - kMargin));
      EXPECT_LE(at_ns, static_cast<int64_t>(evs[i].after + kMargin));
    } else if (evs[i].after + kMargin < w0) {
      EXPECT_FALSE(got.count(i)) << "event " << i << " ended before the window but is there";
    }
  }
  EXPECT_GE(got.size(), expected);
  EXPECT_LE(got.size(), expected + 20);  // at most the events within the margins
  // Contiguous: nothing inside the window is lost.
  EXPECT_EQ(static_cast<size_t>(got.rbegin()->first - got.begin()->first + 1), got.size());
  EXPECT_EQ(got.rbegin()->first, static_cast<int64_t>(evs.size() - 1));

  // A second dump is a run of its own, with what came since.
  ASSERT_TRUE(prof::dump_flight_recorder().ok());
  EXPECT_NE(prof::last_trace_files().run_dir, first_run);
  bool seen = false;
  for (const auto& e : Events(*FindPlane(ReadXSpace(prof::last_trace_files().xplane_path), "/host:CPU")))
    seen |= e.name == "after_dump";
  EXPECT_TRUE(seen);
  EXPECT_FALSE(ReadXSpace(prof::last_trace_files().trace_json_path.empty() ? "" : prof::last_trace_files().xplane_path)
                   .planes()
                   .empty());
  EXPECT_TRUE(fs::exists(prof::last_trace_files().trace_json_path));
  ASSERT_TRUE(prof::stop_trace().ok());
  EXPECT_FALSE(prof::flight_recorder_active());
  EXPECT_EQ(prof::dump_flight_recorder().code(), StatusCode::kFailedPrecondition);
}

// Memory: threads writing 40 times the budget raise the RSS by no more than
// the budget (plus the threads' stacks).
TEST(FlightRecorder, MemoryStaysWithinTheBudget) {
  constexpr uint64_t kBudget = 4 << 20;
  std::string dir = MakeTempDir();
  int64_t before = spyglass::testing::RssBytes();
  ASSERT_TRUE(prof::start_trace(dir, Ring(60, kBudget)).ok());
  std::vector<std::thread> threads;
  std::string name(200, 'x');
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 200000; ++i) prof::TraceAnnotation a(std::string_view(name), {{"seq", i}});
    });
  for (auto& t : threads) t.join();  // 4 x 200000 x ~240 bytes = 190 MB written
  int64_t during = spyglass::testing::RssBytes();
  ASSERT_TRUE(prof::stop_trace().ok());
  EXPECT_LE(during - before, static_cast<int64_t>(kBudget + (2 << 20)))
      << "RSS grew by " << spyglass::testing::Mib(during - before) << " MiB for a ring of 4 MiB";
  auto space = ReadXSpace(prof::last_trace_files().xplane_path);
  auto stats = PlaneStats(*FindPlane(space, "/host:CPU"));
  // Every thread had its share of the ring: events were overwritten, none dropped.
  EXPECT_EQ(stats.at("dropped_events"), "0");
  EXPECT_GT(std::stoull(stats.at("overwritten_events")), 700000u);
  // Shown on the timeline too, as drops are.
  EXPECT_NE(spyglass::testing::ReadGzip(prof::last_trace_files().trace_json_path)
                .find("events overwritten by the flight recorder's ring"),
            std::string::npos);
}

TEST(FlightRecorder, SlowStepDumpsOnce) {
  std::string dir = MakeTempDir();
  prof::TraceOptions t = Ring(30, 8 << 20);
  t.profiler_options.advanced_configuration.emplace("spyglass_dump_if_step_slower_than_ms", 100);
  ASSERT_TRUE(prof::start_trace(dir, t).ok());
  for (int i = 0; i < 5; ++i) prof::StepTraceAnnotation step("train", i);
  {
    prof::StepTraceAnnotation step("train", 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  ASSERT_TRUE(WaitForRuns(dir, 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  {
    prof::StepTraceAnnotation step("train", 6);  // slow too, but within the window of the first dump
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto runs = Runs(dir);
  ASSERT_EQ(runs.size(), 1u);
  std::set<std::string> steps;
  for (const auto& e : Events(*FindPlane(ReadXSpace(XPlaneIn(runs[0])), "/host:CPU")))
    if (e.stats.count("step_num")) steps.insert(e.stats.at("step_num"));
  EXPECT_EQ(steps, (std::set<std::string>{"0", "1", "2", "3", "4", "5"}));
  ASSERT_TRUE(prof::stop_trace().ok());
}

TEST(FlightRecorder, SignalDumpsOnlyWhenAsked) {
  struct sigaction sa {};
  std::string dir = MakeTempDir();
  ASSERT_TRUE(prof::start_trace(dir, Ring(30, 8 << 20)).ok());
  sigaction(SIGUSR1, nullptr, &sa);
  EXPECT_EQ(sa.sa_handler, SIG_DFL);  // not enabled: SIGUSR1 is left alone
  ASSERT_TRUE(prof::stop_trace().ok());

  dir = MakeTempDir();
  prof::TraceOptions t = Ring(30, 8 << 20);
  t.profiler_options.advanced_configuration.emplace("spyglass_dump_signal", "SIGUSR1");
  ASSERT_TRUE(prof::start_trace(dir, t).ok());
  { prof::TraceAnnotation a("before_signal"); }
  ASSERT_EQ(raise(SIGUSR1), 0);
  ASSERT_TRUE(WaitForRuns(dir, 1));
  bool seen = false;
  for (const auto& e : Events(*FindPlane(ReadXSpace(XPlaneIn(Runs(dir)[0])), "/host:CPU")))
    seen |= e.name == "before_signal";
  EXPECT_TRUE(seen);
  ASSERT_TRUE(prof::stop_trace().ok());
  sigaction(SIGUSR1, nullptr, &sa);
  EXPECT_EQ(sa.sa_handler, SIG_DFL);  // restored at stop
}

TEST(FlightRecorder, BadOptionsFailClearly) {
  prof::TraceOptions t = Ring(10, 8 << 20);
  t.profiler_options.advanced_configuration.emplace("spyglass_dump_signal", "SIGSEGV");
  auto s = prof::start_trace(MakeTempDir(), t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("spyglass_dump_signal"), std::string::npos) << s.message();
  s = prof::start_trace(MakeTempDir(), Ring(10, 1000));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ring_buffer_bytes"), std::string::npos) << s.message();
  EXPECT_EQ(prof::dump_flight_recorder(MakeTempDir()).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(prof::start_trace(MakeTempDir()).ok());  // not a flight recorder
  EXPECT_EQ(prof::dump_flight_recorder().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(prof::stop_trace().ok());
}

// A program killed by SIGSEGV leaves a run: the crash handler's XSpace, with
// the events (nested, with arguments and steps) and the one still open.
TEST(FlightRecorder, SegfaultLeavesAReadableRun) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers handle SIGSEGV themselves";
#endif
  std::string dir = MakeTempDir();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!prof::start_trace(dir, Ring(30, 8 << 20)).ok()) _exit(3);
    for (int i = 0; i < 3; ++i) {
      prof::StepTraceAnnotation step("train", i);
      prof::TraceAnnotation a("inner", {{"i", i}, {"what", "text"}, {"x", 0.5}});
    }
    prof::TraceAnnotation open(std::string_view("open_at_crash"));
    *static_cast<volatile int*>(nullptr) = 1;
    _exit(4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);  // the process died as it would have
  auto runs = Runs(dir);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_NE(runs[0].find("_crash_" + std::to_string(pid)), std::string::npos);
  std::string xplane = XPlaneIn(runs[0]);
  ASSERT_FALSE(xplane.empty());
  auto space = ReadXSpace(xplane);
  ASSERT_TRUE(space.errors().empty());
  const auto* host = FindPlane(space, "/host:CPU");
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(PlaneStats(*host).at("overwritten_events"), "0");
  std::map<std::string, int> count;
  for (const auto& e : Events(*host)) {
    ++count[e.name];
    if (e.name == "inner") {
      EXPECT_EQ(e.stats.at("what"), "text");
      EXPECT_EQ(e.stats.at("x"), "0.500000");
    }
    if (e.name == "train") EXPECT_EQ(e.stats.at("_r"), "1");
    if (e.name == "open_at_crash") EXPECT_EQ(e.stats.at("incomplete"), "1");
  }
  EXPECT_EQ(count["train"], 3);
  EXPECT_EQ(count["inner"], 3);
  EXPECT_EQ(count["open_at_crash"], 1);
  ASSERT_EQ(space.warnings_size(), 1);
  EXPECT_NE(space.warnings(0).find("signal 11"), std::string::npos);
  // No temporary file is left beside the run.
  for (const auto& e : fs::directory_iterator(dir + "/plugins/profile")) EXPECT_TRUE(e.is_directory()) << e.path();
}

// A forked child does not inherit the triggers: its crash writes nothing
// (the crash file is the parent's), and the parent's recorder goes on.
TEST(FlightRecorder, ForkedChildDoesNotDumpTheParentsRing) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers handle SIGSEGV themselves";
#endif
  std::string dir = MakeTempDir();
  prof::TraceOptions t = Ring(30, 8 << 20);
  t.profiler_options.advanced_configuration.emplace("spyglass_dump_signal", "SIGUSR1");
  ASSERT_TRUE(prof::start_trace(dir, t).ok());
  { prof::TraceAnnotation a("parent"); }
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    struct sigaction sa {};
    sigaction(SIGUSR1, nullptr, &sa);
    if (sa.sa_handler != SIG_DFL) _exit(5);
    raise(SIGSEGV);
    _exit(4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  EXPECT_TRUE(Runs(dir).empty());
  ASSERT_TRUE(prof::dump_flight_recorder().ok());
  EXPECT_EQ(Runs(dir).size(), 1u);
  ASSERT_TRUE(prof::stop_trace().ok());
}

// The profiler server: a capture with the flight-recorder option gets the
// ring at once (no duration waited), and fails clearly without a recorder.
TEST(FlightRecorder, ServerCaptureRepliesWithTheRing) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "gRPC is not built with ThreadSanitizer";
#endif
  ASSERT_TRUE(prof::start_server(0).ok());
  std::string address = "127.0.0.1:" + std::to_string(prof::server_port());
  spyglass::server::CaptureOptions o;
  o.duration_ms = 1;
  o.profile.python_tracer_level = 0;
  o.profile.advanced_configuration.insert_or_assign("spyglass_flight_recorder", true);
  spyglass::server::CaptureResult result;
  // No flight recorder yet: that host fails, saying why.
  (void)spyglass::server::Capture({address}, o, MakeTempDir(), &result);
  ASSERT_EQ(result.hosts.size(), 1u);
  EXPECT_NE(result.hosts[0].error.find("no flight recorder"), std::string::npos) << result.hosts[0].error;

  ASSERT_TRUE(prof::start_trace(MakeTempDir(), Ring(30, 8 << 20)).ok());
  for (int i = 0; i < 3; ++i) prof::StepTraceAnnotation step("train", i);
  result = {};
  ASSERT_TRUE(spyglass::server::Capture({address}, o, MakeTempDir(), &result).ok());
  ASSERT_EQ(result.hosts.size(), 1u);
  ASSERT_TRUE(result.hosts[0].error.empty()) << result.hosts[0].error;
  int steps = 0;
  for (const auto& e : Events(*FindPlane(ReadXSpace(result.hosts[0].xplane_path), "/host:CPU")))
    steps += e.name == "train";
  EXPECT_EQ(steps, 3);
  EXPECT_TRUE(prof::flight_recorder_active());  // the capture did not stop it
  ASSERT_TRUE(prof::stop_trace().ok());
  ASSERT_TRUE(prof::stop_server().ok());
}

}  // namespace
