// The tracer registry (src/session/tracer.h): sessions start registered
// tracers in rank order whatever the registration order, stop them in the
// reverse order, and take data and stats from each; a factory that returns
// nullptr leaves its tracer out.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "session/options_text.h"
#include "session/session.h"
#include "session/tracer.h"
#include "spyglass/internal/recorder.h"

namespace spyglass::session {
namespace {

// Test tracers are off (factories return nullptr) unless a test turns them on,
// so that they stay out of sessions they are not about.
bool g_on = false;
std::string g_fail;  // the tracer whose Start fails
int g_slow_start_ms = 0;  // how long "before_host" takes to start
std::vector<std::string> g_log;

class TestTracer : public Tracer {
 public:
  TestTracer(std::string name, uint64_t events) : name_(std::move(name)), events_(events) {}
  Status Start() override {
    if (name_ == "before_host" && g_slow_start_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(g_slow_start_ms));
    // Whether the host recorder runs now: begin_static records only then.
    uint64_t w = internal::begin_static("registry_test_probe", 1);
    internal::end(w);
    g_log.push_back("start " + name_ + (w != 0 ? " (recording)" : ""));
    return name_ == g_fail ? InternalError(name_ + " failed") : Status::Ok();
  }
  Status Stop() override {
    g_log.push_back("stop " + name_);
    return Status::Ok();
  }
  Status CollectData(model::Space* space) override {
    model::Plane& p = space->plane("/test:" + name_);
    p.stats.push_back(p.uint_stat("collected_by", events_));
    return Status::Ok();
  }
  void AddStats(SessionSummary* summary) const override {
    summary->events += events_;
    summary->threads += 1;
  }

 private:
  std::string name_;
  uint64_t events_;
};

TracerFactory Factory(const std::string& name, uint64_t events) {
  return [name, events](const profiler::ProfileOptions&) -> std::unique_ptr<Tracer> {
    g_log.push_back("factory " + name);
    if (!g_on) return nullptr;
    return std::make_unique<TestTracer>(name, events);
  };
}

class TracerRegistry : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static bool registered = false;  // once per process (--gtest_repeat)
    if (registered) return;
    registered = true;
    // Wrong order on purpose: ranks decide, not registration time.
    ASSERT_TRUE(RegisterTracer("late", kRankHost + 2, Factory("late", 5)));
    ASSERT_TRUE(RegisterTracer("before_host", kRankHost - 1, Factory("before_host", 7)));
    ASSERT_TRUE(RegisterTracer("early", kRankHost + 1, Factory("early", 3)));
    ASSERT_TRUE(RegisterTracer("off", kRankHost + 3, [](const profiler::ProfileOptions&) -> std::unique_ptr<Tracer> {
      g_log.push_back("factory off");
      return nullptr;
    }));
  }
  void SetUp() override {
    g_log.clear();
    g_on = true;
  }
  void TearDown() override {
    g_on = false;
    g_fail.clear();
    g_slow_start_ms = 0;
  }
};

std::vector<std::string> Without(std::vector<std::string> log, const std::string& prefix) {
  std::erase_if(log, [&](const std::string& s) { return s.rfind(prefix, 0) == 0; });
  return log;
}

TEST_F(TracerRegistry, StartsInRankOrderStopsInReverse) {
  profiler::ProfileOptions options;
  std::unique_ptr<Session> session;
  ASSERT_TRUE(Session::Create(options, "busy", &session).ok());
  // Factories run in rank order too; "off" was asked and left out.
  EXPECT_EQ(g_log, (std::vector<std::string>{"factory before_host", "factory early", "factory late", "factory off",
                                             // The host tracer (rank kRankHost) starts between them.
                                             "start before_host", "start early (recording)",
                                             "start late (recording)"}));
  g_log.clear();
  model::Space space;
  SessionSummary summary;
  ASSERT_TRUE(session->Stop(&space, &summary).ok());
  EXPECT_EQ(g_log, (std::vector<std::string>{"stop late", "stop early", "stop before_host"}));

  // Each tracer's data and stats land in the model and the summary.
  const std::pair<const char*, uint64_t> expected[] = {{"before_host", 7}, {"early", 3}, {"late", 5}};
  for (const auto& [name, events] : expected) {
    model::Plane* p = space.find_plane(std::string("/test:") + name);
    ASSERT_NE(p, nullptr) << name;
    ASSERT_FALSE(p->stats.empty());
    EXPECT_EQ(p->stat_name(p->stats[0]), "collected_by");
    EXPECT_EQ(p->stats[0].u64, events);
  }
  EXPECT_EQ(space.find_plane("/test:off"), nullptr);
  // The host tracer's stats come through the same hook: the two probes that
  // ran while it recorded, on this thread's line.
  model::Plane* host = space.find_plane(model::kHostPlaneName);
  ASSERT_NE(host, nullptr);
  uint64_t host_events = 0, probes = 0, host_threads = 0;
  for (const model::Line& l : host->lines) {
    if (l.name == "_counters_") continue;  // the memory timeline's
    ++host_threads;
    host_events += l.events.size();
    for (const model::Event& e : l.events)
      probes += host->event_metadata()[e.metadata_id].name == "registry_test_probe";
  }
  EXPECT_EQ(probes, 2u);
  EXPECT_GE(host_threads, 1u);
  EXPECT_EQ(summary.events, 7u + 3u + 5u + host_events);
  EXPECT_EQ(summary.threads, 3u + host_threads);
}

// One time base: an event's time is its wall time, however long the tracers
// started before the host tracer took (the session's zero is taken once,
// before the first starts; each tracer counted from its own start before).
TEST_F(TracerRegistry, EveryTracerCountsFromTheSessionsZero) {
  g_slow_start_ms = 200;
  profiler::ProfileOptions options;
  std::unique_ptr<Session> session;
  ASSERT_TRUE(Session::Create(options, "busy", &session).ok());
  const uint64_t wall = internal::wall_ns();
  internal::end(internal::begin_static("zero_probe", 1));
  model::Space space;
  SessionSummary summary;
  ASSERT_TRUE(session->Stop(&space, &summary).ok());
  model::Plane* env = space.find_plane(model::kTaskEnvPlaneName);
  ASSERT_NE(env, nullptr);
  uint64_t start = 0;
  for (const model::Stat& s : env->stats)
    if (env->stat_name(s) == model::kProfileStartTimeStat) start = s.u64;
  ASSERT_GT(start, 0u);
  model::Plane* host = space.find_plane(model::kHostPlaneName);
  ASSERT_NE(host, nullptr);
  int64_t at = -1;
  for (const model::Line& l : host->lines)
    for (const model::Event& e : l.events)
      if (host->event_metadata()[e.metadata_id].name == "zero_probe")
        at = static_cast<int64_t>(start) + l.timestamp_ns + e.offset_ps / 1000;
  ASSERT_GE(at, 0);
  // Within 20 ms (the probe follows its wall reading at once); 200 ms off before.
  EXPECT_LT(std::llabs(at - static_cast<int64_t>(wall)), 20'000'000) << (at - static_cast<int64_t>(wall)) / 1000000
                                                                      << " ms";
}

TEST_F(TracerRegistry, HostTracerOffIsLeftOut) {
  profiler::ProfileOptions options;
  options.host_tracer_level = 0;
  std::unique_ptr<Session> session;
  ASSERT_TRUE(Session::Create(options, "busy", &session).ok());
  EXPECT_EQ(Without(g_log, "factory"),
            (std::vector<std::string>{"start before_host", "start early", "start late"}));
  model::Space space;
  SessionSummary summary;
  ASSERT_TRUE(session->Stop(&space, &summary).ok());
  EXPECT_EQ(summary.events, 7u + 3u + 5u);
  EXPECT_EQ(summary.threads, 3u);
}

TEST_F(TracerRegistry, DestroyedWithoutStopStopsInReverse) {
  profiler::ProfileOptions options;
  std::unique_ptr<Session> session;
  ASSERT_TRUE(Session::Create(options, "busy", &session).ok());
  g_log.clear();
  session.reset();
  EXPECT_EQ(g_log, (std::vector<std::string>{"stop late", "stop early", "stop before_host"}));
}

TEST_F(TracerRegistry, StartFailureStopsWhatStartedInReverse) {
  g_fail = "early";
  profiler::ProfileOptions options;
  options.host_tracer_level = 0;
  options.raise_error_on_start_failure = true;
  std::unique_ptr<Session> session;
  Status s = Session::Create(options, "busy", &session);
  EXPECT_EQ(s.message(), "early failed");
  EXPECT_EQ(session, nullptr);
  EXPECT_EQ(Without(g_log, "factory"),
            (std::vector<std::string>{"start before_host", "start early", "stop early", "stop before_host"}));
  // Without raise_error_on_start_failure the session runs on.
  g_log.clear();
  options.raise_error_on_start_failure = false;
  ASSERT_TRUE(Session::Create(options, "busy", &session).ok());
  session.reset();
  EXPECT_EQ(Without(g_log, "factory"), (std::vector<std::string>{"start before_host", "start early", "start late",
                                                                  "stop late", "stop early", "stop before_host"}));
}

TEST_F(TracerRegistry, NamesAreUnique) {
  EXPECT_FALSE(RegisterTracer("early", kRankHost - 10, Factory("again", 1)));
  // Built-in tracers are registered under their names at load.
  EXPECT_FALSE(RegisterTracer("host", kRankHost, Factory("again", 1)));
  EXPECT_FALSE(RegisterTracer("memory_timeline", kRankMemoryTimeline, Factory("again", 1)));
  EXPECT_FALSE(RegisterTracer("subprocesses", kRankSubprocesses, Factory("again", 1)));
  profiler::ProfileOptions options;
  options.host_tracer_level = 0;
  std::unique_ptr<Session> session;
  ASSERT_TRUE(Session::Create(options, "busy", &session).ok());
  EXPECT_EQ(Without(g_log, "factory"),
            (std::vector<std::string>{"start before_host", "start early", "start late"}));
}

}  // namespace
}  // namespace spyglass::session

namespace spyglass::session {
namespace {

// A tracer's options come with its registration: unknown before it, then
// accepted with their type and checked by the tracer's validation, through
// ValidateOptions and SPYGLASS_OPTIONS's parser alike.
TEST(TracerOptions, ComeWithTheTracersRegistration) {
  profiler::ProfileOptions o;
  o.advanced_configuration.emplace("registry_test_limit", int64_t{3});
  Status before = profiler::ValidateOptions(o);
  EXPECT_EQ(before.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(before.message().find("unknown advanced_configuration key 'registry_test_limit'"), std::string::npos)
      << before.message();

  TracerOptionSpec spec{{{"registry_test_limit", OptionType::kInt}}, [](const profiler::ProfileOptions& opts) {
                          auto it = opts.advanced_configuration.find("registry_test_limit");
                          if (it != opts.advanced_configuration.end() && it->second.as_int() > 5)
                            return InvalidArgumentError("registry_test_limit must be at most 5");
                          return Status::Ok();
                        }};
  ASSERT_TRUE(RegisterTracer("registry_test_with_options", 999, [](const profiler::ProfileOptions&) {
    return std::unique_ptr<Tracer>();
  }, spec));
  EXPECT_TRUE(profiler::ValidateOptions(o).ok());
  o.advanced_configuration.insert_or_assign("registry_test_limit", int64_t{7});
  EXPECT_NE(profiler::ValidateOptions(o).message().find("at most 5"), std::string::npos);
  o.advanced_configuration.insert_or_assign("registry_test_limit", "three");
  EXPECT_NE(profiler::ValidateOptions(o).message().find("takes a int value"), std::string::npos)
      << profiler::ValidateOptions(o).message();
  profiler::ProfileOptions text;
  EXPECT_TRUE(profiler::SetOptionFromText("registry_test_limit", "4", &text).ok());
  EXPECT_EQ(text.advanced_configuration.at("registry_test_limit").as_int(), 4);
  EXPECT_FALSE(profiler::SetOptionFromText("registry_test_limit", "four", &text).ok());
}

}  // namespace
}  // namespace spyglass::session
