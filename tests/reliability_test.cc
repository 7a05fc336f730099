// Threads, repeated sessions and fork: run under TSan and ASan by
// scripts/sanitizers.sh.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "spyglass/profiler.h"
#include "test_util.h"

namespace prof = spyglass::profiler;
using spyglass::testing::Events;
using spyglass::testing::FindPlane;
using spyglass::testing::MakeTempDir;
using spyglass::testing::ReadXSpace;

namespace {

TEST(Reliability, ManyThreadsWhileSessionsStartAndStop) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      std::string name = "dyn_" + std::to_string(t);
      for (int i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        prof::TraceAnnotation a("static_outer");
        prof::TraceAnnotation b(name, {{"t", t}});
        prof::StepTraceAnnotation s("step", t);
        // Leave the two cores to the session thread now and then.
        if (i % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  std::string dir = MakeTempDir();
  for (int i = 0; i < 20; ++i) {
    prof::TraceOptions o;
    o.profiler_options.session_id = "s" + std::to_string(i);
    ASSERT_TRUE(prof::start_trace(dir, o).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(prof::stop_trace().ok());
    auto space = ReadXSpace(prof::last_trace_files().xplane_path);
    ASSERT_EQ(space.errors_size(), 0);
    // Every recorded event is well formed: nested events lie inside parents.
    for (const auto& e : Events(*FindPlane(space, "/host:CPU"))) {
      ASSERT_GE(e.duration_ps, 0);
      ASSERT_TRUE(e.name == "static_outer" || e.name.rfind("dyn_", 0) == 0 || e.name == "step") << e.name;
    }
  }
  stop = true;
  for (auto& t : threads) t.join();
}

TEST(Reliability, ThreadsThatExitBeforeStopKeepTheirEvents) {
  ASSERT_TRUE(prof::start_trace(MakeTempDir()).ok());
  for (int i = 0; i < 16; ++i) {
    std::thread([i] {
      prof::set_thread_name("short-lived-" + std::to_string(i));
      prof::TraceAnnotation a("from_exited_thread", {{"i", i}});
    }).join();
  }
  ASSERT_TRUE(prof::stop_trace().ok());
  auto events = Events(*FindPlane(ReadXSpace(prof::last_trace_files().xplane_path), "/host:CPU"));
  int n = 0;
  for (const auto& e : events) n += e.name == "from_exited_thread";
  EXPECT_EQ(n, 16);
}

TEST(Reliability, ManyShortLivedThreadsDoNotEachPinAChunk) {
  // 1000 threads x one 128 KiB chunk would be 125 MiB; the bound is 16 MiB.
  prof::TraceOptions o;
  o.profiler_options.buffer_bytes_total = 16 << 20;
  ASSERT_TRUE(prof::start_trace(MakeTempDir(), o).ok());
  for (int i = 0; i < 1000; ++i) std::thread([] { prof::TraceAnnotation a("short_thread"); }).join();
  ASSERT_TRUE(prof::stop_trace().ok());
  EXPECT_EQ(prof::last_trace_stats().dropped_events, 0u);
  EXPECT_EQ(prof::last_trace_stats().events, 1000u);
}

TEST(Reliability, ThreadsCreatedDuringASessionAreRecorded) {
  ASSERT_TRUE(prof::start_trace(MakeTempDir()).ok());
  std::atomic<bool> stop{false};
  std::thread late([&] {
    while (!stop) prof::TraceAnnotation a("late_thread");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(prof::stop_trace().ok());
  stop = true;
  late.join();
  auto events = Events(*FindPlane(ReadXSpace(prof::last_trace_files().xplane_path), "/host:CPU"));
  EXPECT_FALSE(events.empty());
}

TEST(Reliability, ForkDuringASessionLeavesTheParentTraceIntact) {
  ASSERT_TRUE(prof::start_trace(MakeTempDir()).ok());
  { prof::TraceAnnotation a("parent_before_fork"); }
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child inherits a copy of the session; whatever it does stays in its
    // own address space.
    for (int i = 0; i < 100000; ++i) prof::TraceAnnotation a("child_event");
    bool ok = !prof::TraceAnnotation::is_enabled() &&
              prof::stop_trace().code() == spyglass::StatusCode::kFailedPrecondition;
    // The child may profile itself.
    ok = ok && prof::start_trace(MakeTempDir()).ok();
    { prof::TraceAnnotation a("child_own_session"); }
    ok = ok && prof::stop_trace().ok() && prof::last_trace_stats().events == 1;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  { prof::TraceAnnotation a("parent_after_fork"); }
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_TRUE(prof::stop_trace().ok());
  auto events = Events(*FindPlane(ReadXSpace(prof::last_trace_files().xplane_path), "/host:CPU"));
  int parent = 0;
  for (const auto& e : events) {
    EXPECT_NE(e.name, "child_event");
    parent += e.name.rfind("parent_", 0) == 0;
  }
  EXPECT_EQ(parent, 2);
}

}  // namespace
