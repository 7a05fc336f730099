// Annotations end to end: record under a session, read the .xplane.pb back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "spyglass/profiler.h"
#include "test_util.h"

namespace prof = spyglass::profiler;
using spyglass::testing::Events;
using spyglass::testing::FindPlane;
using spyglass::testing::FlatEvent;
using spyglass::testing::MakeTempDir;
using spyglass::testing::ReadXSpace;
using XStat = tensorflow::profiler::XStat;

namespace {

// Runs `body` under a session with `options` and returns the host events.
template <class F>
std::vector<FlatEvent> Record(F body, prof::TraceOptions options = {}) {
  std::string dir = MakeTempDir();
  auto s = prof::start_trace(dir, options);
  EXPECT_TRUE(s.ok()) << s.ToString();
  body();
  s = prof::stop_trace();
  EXPECT_TRUE(s.ok()) << s.ToString();
  auto space = ReadXSpace(prof::last_trace_files().xplane_path);
  EXPECT_EQ(space.errors_size(), 0);
  const auto* host = FindPlane(space, "/host:CPU");
  EXPECT_NE(host, nullptr);
  return host ? Events(*host) : std::vector<FlatEvent>{};
}

const FlatEvent* Find(const std::vector<FlatEvent>& events, const std::string& name) {
  for (const auto& e : events)
    if (e.name == name) return &e;
  return nullptr;
}

int Count(const std::vector<FlatEvent>& events, const std::string& name) {
  return static_cast<int>(std::count_if(events.begin(), events.end(), [&](auto& e) { return e.name == name; }));
}

TEST(Annotation, StaticAndDynamicNamesNest) {
  std::string dynamic = "dynamic_" + std::to_string(42);
  auto events = Record([&] {
    prof::TraceAnnotation outer("outer");
    {
      prof::TraceAnnotation inner(dynamic);
      prof::TraceAnnotation innermost(std::string_view("view_name"));
    }
  });
  const FlatEvent* outer = Find(events, "outer");
  const FlatEvent* inner = Find(events, "dynamic_42");
  const FlatEvent* innermost = Find(events, "view_name");
  ASSERT_TRUE(outer && inner && innermost);
  EXPECT_EQ(outer->line_id, inner->line_id);
  EXPECT_LE(outer->start_ps, inner->start_ps);
  EXPECT_GE(outer->start_ps + outer->duration_ps, inner->start_ps + inner->duration_ps);
  EXPECT_LE(inner->start_ps, innermost->start_ps);
  EXPECT_GE(inner->start_ps + inner->duration_ps, innermost->start_ps + innermost->duration_ps);
  EXPECT_EQ(outer->stats.count("incomplete"), 0u);
}

TEST(Annotation, TypedArgumentsBecomeStats) {
  auto events = Record([] {
    prof::TraceAnnotation a("with_args", {{"i", -7}, {"u", 7u}, {"d", 2.5}, {"s", "text, with comma"}, {"b", true}});
    a.set_metadata({{"later", 3}});
  });
  const FlatEvent* e = Find(events, "with_args");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->stats.at("i"), "-7");
  EXPECT_EQ(e->stat_case.at("i"), XStat::kInt64Value);
  EXPECT_EQ(e->stats.at("u"), "7");
  EXPECT_EQ(e->stat_case.at("u"), XStat::kUint64Value);
  EXPECT_EQ(e->stat_case.at("d"), XStat::kDoubleValue);
  EXPECT_EQ(e->stats.at("d"), "2.500000");
  EXPECT_EQ(e->stats.at("s"), "text, with comma");
  EXPECT_EQ(e->stat_case.at("s"), XStat::kRefValue);  // interned, as the reference does
  EXPECT_EQ(e->stats.at("b"), "1");
  EXPECT_EQ(e->stats.at("later"), "3");
}

TEST(Annotation, StepAnnotationCarriesStepStatsAsInt64) {
  auto events = Record([] {
    for (int i = 0; i < 3; ++i) {
      prof::StepTraceAnnotation step("train", i, {{"batch", 32}});
      prof::TraceAnnotation inner("inner");
    }
  });
  ASSERT_EQ(Count(events, "train"), 3);
  for (const auto& e : events) {
    if (e.name != "train") continue;
    EXPECT_EQ(e.stats.at("_r"), "1");
    EXPECT_EQ(e.stat_case.at("_r"), XStat::kInt64Value);
    EXPECT_EQ(e.stat_case.at("step_num"), XStat::kInt64Value);
    EXPECT_EQ(e.stats.at("batch"), "32");
  }
  EXPECT_EQ(Count(events, "inner"), 3);
}

TEST(Annotation, TraceMeEncodedNamesAreDecoded) {
  auto events = Record([] { prof::TraceAnnotation a(std::string("encoded#k=5,name=abc,x=1.5#")); });
  const FlatEvent* e = Find(events, "encoded");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->stats.at("k"), "5");
  EXPECT_EQ(e->stat_case.at("k"), XStat::kInt64Value);
  EXPECT_EQ(e->stats.at("name"), "abc");
  EXPECT_EQ(e->stat_case.at("x"), XStat::kDoubleValue);
}

int Square(int x) { return x * x; }

TEST(Annotation, AnnotateFunction) {
  int result = 0;
  auto events = Record([&] {
    auto f = prof::annotate_function(Square, "square", {{"kind", "math"}, {"version", 2}});
    auto g = SPYGLASS_ANNOTATE_FUNCTION(Square);
    result = f(3) + g(4);
  });
  EXPECT_EQ(result, 25);
  const FlatEvent* e = Find(events, "square");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->stats.at("kind"), "math");
  EXPECT_EQ(e->stats.at("version"), "2");
  EXPECT_NE(Find(events, "Square"), nullptr);
}

TEST(Annotation, LazyNameRunsOnlyWhenRecording) {
  int calls = 0;
  auto make = [&] {
    ++calls;
    return std::string("lazy");
  };
  { prof::TraceAnnotation idle(make); }
  EXPECT_EQ(calls, 0);
  auto events = Record([&] { prof::TraceAnnotation a(make); });
  EXPECT_EQ(calls, 1);
  EXPECT_NE(Find(events, "lazy"), nullptr);
}

TEST(Annotation, LevelsFilterEvents) {
  prof::TraceOptions options;
  options.profiler_options.host_tracer_level = 1;
  auto events = Record([] {
    prof::TraceAnnotation a("critical", prof::kLevelCritical);
    prof::TraceAnnotation b("info", prof::kLevelInfo);
    prof::TraceAnnotation c("verbose", prof::kLevelVerbose);
  }, options);
  EXPECT_NE(Find(events, "critical"), nullptr);
  EXPECT_EQ(Find(events, "info"), nullptr);
  EXPECT_EQ(Find(events, "verbose"), nullptr);

  options.profiler_options.host_tracer_level = 3;
  events = Record([] {
    prof::TraceAnnotation c("verbose", prof::kLevelVerbose);
  }, options);
  EXPECT_NE(Find(events, "verbose"), nullptr);

  options.profiler_options.host_tracer_level = 0;
  events = Record([] { prof::TraceAnnotation a("critical"); }, options);
  EXPECT_TRUE(events.empty());
}

TEST(Annotation, NothingRecordedOutsideASession) {
  { prof::TraceAnnotation before("before"); }
  EXPECT_FALSE(prof::TraceAnnotation::is_enabled());
  prof::TraceAnnotation* straddling = nullptr;
  auto events = Record([&] {
    EXPECT_TRUE(prof::TraceAnnotation::is_enabled());
    prof::TraceAnnotation inside("inside");
  });
  delete straddling;
  EXPECT_EQ(Find(events, "before"), nullptr);
  EXPECT_NE(Find(events, "inside"), nullptr);
}

TEST(Annotation, EventsOpenAtStopAreClosedAndMarked) {
  std::string dir = MakeTempDir();
  ASSERT_TRUE(prof::start_trace(dir).ok());
  auto* open = new prof::TraceAnnotation("still_open");
  { prof::TraceAnnotation done("done"); }
  ASSERT_TRUE(prof::stop_trace().ok());
  delete open;  // ends after the session: must not disturb anything
  EXPECT_EQ(prof::last_trace_stats().incomplete_events, 1u);
  auto space = ReadXSpace(prof::last_trace_files().xplane_path);
  auto events = Events(*FindPlane(space, "/host:CPU"));
  const FlatEvent* e = Find(events, "still_open");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->stats.at("incomplete"), "1");
  EXPECT_GT(e->duration_ps, 0);
  EXPECT_EQ(Find(events, "done")->stats.count("incomplete"), 0u);
}

TEST(Annotation, EventStartedInOneSessionDoesNotEndInTheNext) {
  std::string dir = MakeTempDir();
  ASSERT_TRUE(prof::start_trace(dir).ok());
  auto* first = new prof::TraceAnnotation("first_session");
  ASSERT_TRUE(prof::stop_trace().ok());
  ASSERT_TRUE(prof::start_trace(dir).ok());
  {
    prof::TraceAnnotation second("second_session");
    delete first;  // its end must not close "second_session"
    prof::TraceAnnotation nested("nested");
  }
  ASSERT_TRUE(prof::stop_trace().ok());
  auto events = Events(*FindPlane(ReadXSpace(prof::last_trace_files().xplane_path), "/host:CPU"));
  EXPECT_EQ(Find(events, "first_session"), nullptr);
  const FlatEvent* second = Find(events, "second_session");
  const FlatEvent* nested = Find(events, "nested");
  ASSERT_TRUE(second && nested);
  EXPECT_EQ(second->stats.count("incomplete"), 0u);
  EXPECT_GE(second->start_ps + second->duration_ps, nested->start_ps + nested->duration_ps);
}

TEST(Annotation, ThreadNamesAppearAsLineNames) {
  auto events = Record([] {
    std::thread t([] {
      prof::set_thread_name("worker-7");
      prof::TraceAnnotation a("on_worker");
    });
    t.join();
    std::thread os_named([] {
      pthread_setname_np(pthread_self(), "os-named");
      prof::TraceAnnotation a("on_os_named");
    });
    os_named.join();
  });
  EXPECT_EQ(Find(events, "on_worker")->line_name, "worker-7");
  EXPECT_EQ(Find(events, "on_os_named")->line_name, "os-named");
}

TEST(Annotation, LongNamesAreTruncatedNotCorrupted) {
  std::string long_name(10000, 'x');
  auto events = Record([&] {
    prof::TraceAnnotation a(long_name);
    prof::TraceAnnotation b("after_long");
  });
  ASSERT_NE(Find(events, "after_long"), nullptr);
  bool found = false;
  for (const auto& e : events) found |= e.name == std::string(spyglass::internal::kMaxStringBytes, 'x');
  EXPECT_TRUE(found);
}

}  // namespace

// A name in a char buffer is copied when the annotation begins: the buffer
// may be reused (here: overwritten and its stack frame left) before stop.
__attribute__((noinline)) void AnnotateFromStackBuffer(int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "from_buffer_%d", i);
  prof::TraceAnnotation a(buf);
  prof::StepTraceAnnotation s(buf, i);
  std::memset(buf, 'x', sizeof buf - 1);
}

__attribute__((noinline)) void ClobberStack() {
  volatile char junk[256];
  for (auto& c : junk) c = 'y';
}

TEST(Annotation, CharBuffersAreCopiedNotKeptAsPointers) {
  auto events = Record([] {
    for (int i = 0; i < 3; ++i) {
      AnnotateFromStackBuffer(i);
      ClobberStack();
    }
  });
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(Count(events, "from_buffer_" + std::to_string(i)), 2) << "names of annotation " << i;
}

TEST(Annotation, StaticNamesAreLiteralsAndStaticArrays) {
  static const char kStaticArray[] = "static_array_name";
  auto events = Record([] {
    prof::TraceAnnotation a("literal_name");
    prof::TraceAnnotation b(kStaticArray, {{"k", 1}});
  });
  EXPECT_EQ(Count(events, "literal_name"), 1);
  EXPECT_EQ(Count(events, "static_array_name"), 1);
}
