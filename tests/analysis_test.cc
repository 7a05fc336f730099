// `summary` and `diff` on known traces: XSpaces built here with exact step
// and annotation durations, checked number by number through the library
// (src/analysis) and through the CLI (exit codes, messages); and the read
// API's errors for a file that is not a profile, truncated, or newer.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "analysis/diff.h"
#include "analysis/summary.h"
#include "export/xplane/xplane_writer.h"
#include "model/schema.h"
#include "model/xspace.h"
#include "sampling/cpu_model.h"
#include "analysis/text_table.h"
#include "memory/pprof.h"
#include "model/xspace_import.h"
#include "model/xspace_read.h"
#include "spyglass/profile_reader.h"
#include "test_util.h"
#include "xplane.pb.h"

namespace spyglass {
namespace {

namespace tp = tensorflow::profiler;
using analysis::Summary;

constexpr int64_t kMs = 1'000'000'000;  // ps in a millisecond
constexpr double kMsNs = 1e6;           // ns in a millisecond

struct Known {
  double matmul_scale = 1;  // 2: the "new" run, matmul twice as slow
  bool shuffle = false;     // events written out of order
  bool gpu = true;
  bool loader = true;       // false: no "load" events (the loader thread idle)
};

// Ten steps "train" (step_num 0..9) of 10, 20, ..., 100 ms back to back on
// thread "main"; in each: "forward" (40% of the step) holding "matmul" (25%),
// then "backward" (30%). With matmul_scale, matmul (and so forward and the
// step) grows by that factor of its time. A "loader" thread: "load" 5 ms at
// each step's start. A GPU stream: 10 "gemm_kernel" of 2 ms, 5 "MemcpyH2D" of
// 1 ms. A live-bytes counter 100, 500, 300. dropped_events 3, one warning.
tp::XSpace KnownSpace(const Known& k) {
  tp::XSpace space;
  tp::XPlane* host = space.add_planes();
  host->set_name("/host:CPU");
  auto md = [](tp::XPlane* p, int64_t id, const std::string& name) {
    auto& m = (*p->mutable_event_metadata())[id];
    m.set_id(id);
    m.set_name(name);
  };
  auto smd = [](tp::XPlane* p, int64_t id, const std::string& name) {
    auto& m = (*p->mutable_stat_metadata())[id];
    m.set_id(id);
    m.set_name(name);
  };
  md(host, 1, "train"), md(host, 2, "forward"), md(host, 3, "matmul"), md(host, 4, "backward"), md(host, 5, "load");
  md(host, 6, "memory host");
  smd(host, 1, "step_num"), smd(host, 2, "_r"), smd(host, 3, "live_bytes"), smd(host, 4, "dropped_events");
  auto* dropped = host->add_stats();
  dropped->set_metadata_id(4);
  dropped->set_uint64_value(3);
  tp::XLine* main = host->add_lines();
  main->set_id(1);
  main->set_name("main");
  tp::XLine* loader = host->add_lines();
  loader->set_id(2);
  loader->set_name("loader");
  auto event = [](tp::XLine* l, int64_t md, int64_t start, int64_t dur) {
    tp::XEvent* e = l->add_events();
    e->set_metadata_id(md);
    e->set_offset_ps(start);
    e->set_duration_ps(dur);
    return e;
  };
  int64_t t = 0;
  for (int i = 0; i < 10; ++i) {
    int64_t step = (i + 1) * 10 * kMs;
    int64_t matmul = static_cast<int64_t>(step / 4 * k.matmul_scale);
    int64_t forward = step * 4 / 10 - step / 4 + matmul;
    int64_t backward = step * 3 / 10;
    int64_t total = step - step / 4 + matmul;
    tp::XEvent* s = event(main, 1, t, total);
    tp::XStat* n = s->add_stats();
    n->set_metadata_id(1);
    n->set_int64_value(i);
    tp::XStat* r = s->add_stats();
    r->set_metadata_id(2);
    r->set_int64_value(1);
    event(main, 2, t, forward);
    event(main, 3, t, matmul);  // inside forward (same start, shorter)
    event(main, 4, t + forward, backward);
    if (k.loader) event(loader, 5, t, 5 * kMs);
    t += total;
  }
  tp::XLine* counters = host->add_lines();
  counters->set_id(INT64_MAX);
  counters->set_name("_counters_");
  int64_t values[] = {100, 500, 300};
  for (int i = 0; i < 3; ++i) {
    tp::XStat* v = event(counters, 6, i * 7 * kMs, 0)->add_stats();
    v->set_metadata_id(3);
    v->set_int64_value(values[i]);
  }
  if (k.shuffle) {
    std::mt19937 rng(7);
    auto* ev = main->mutable_events();
    for (int i = ev->size() - 1; i > 0; --i) ev->SwapElements(i, static_cast<int>(rng() % (i + 1)));
  }
  if (k.gpu) {
    tp::XPlane* gpu = space.add_planes();
    gpu->set_name("/device:GPU:0");
    md(gpu, 1, "gemm_kernel"), md(gpu, 2, "MemcpyH2D");
    tp::XLine* stream = gpu->add_lines();
    stream->set_id(7);
    stream->set_name("Stream #7(Compute,MemcpyH2D)");
    for (int i = 0; i < 10; ++i) event(stream, 1, i * 3 * kMs, 2 * kMs);
    for (int i = 0; i < 5; ++i) event(stream, 2, 40 * kMs + i * 2 * kMs, kMs);
  }
  tp::XPlane* env = space.add_planes();
  env->set_name("Task Environment");
  smd(env, 1, "profile_start_time"), smd(env, 2, "profile_stop_time");
  auto* start = env->add_stats();
  start->set_metadata_id(1);
  start->set_uint64_value(1'000'000'000'000'000'000);
  auto* stop = env->add_stats();
  stop->set_metadata_id(2);
  stop->set_uint64_value(1'000'000'000'000'000'000 + 800'000'000);  // 800 ms
  space.add_hostnames("hostA");
  space.add_warnings("w1: something was off");
  return space;
}

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string WriteKnown(const std::string& dir, const std::string& name, const Known& k = {}) {
  return WriteFile(dir, name, KnownSpace(k).SerializeAsString());
}

const analysis::AnnotationRow* Find(const std::vector<analysis::AnnotationRow>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}

TEST(Summary, KnownTraceNumberByNumber) {
  std::string dir = testing::MakeTempDir();
  std::string path = WriteKnown(dir, "host.xplane.pb");
  analysis::SummaryOptions o;
  o.top = 0;
  Summary s;
  ASSERT_TRUE(analysis::Summarize(path, o, &s).ok());
  // Steps 10..100 ms: percentiles interpolated between ranks.
  EXPECT_EQ(s.steps.name, "train");
  EXPECT_EQ(s.steps.duration.count, 10u);
  EXPECT_DOUBLE_EQ(s.steps.duration.mean_ns, 55 * kMsNs);
  EXPECT_DOUBLE_EQ(s.steps.duration.p50_ns, 55 * kMsNs);
  EXPECT_NEAR(s.steps.duration.p90_ns, 91 * kMsNs, 1e-3);
  EXPECT_NEAR(s.steps.duration.p99_ns, 99.1 * kMsNs, 1e-3);
  EXPECT_DOUBLE_EQ(s.steps.duration.max_ns, 100 * kMsNs);
  ASSERT_EQ(s.steps.slowest.size(), 5u);
  EXPECT_EQ(s.steps.slowest[0].number, 9);
  EXPECT_EQ(s.steps.slowest[4].number, 5);
  EXPECT_EQ(s.steps.all.size(), 10u);
  // Wall: the Task Environment's bounds.
  EXPECT_DOUBLE_EQ(s.wall_ns, 800 * kMsNs);
  // Nesting: forward (220 ms) holds matmul (137.5 ms): self 82.5 ms.
  const auto* forward = Find(s.top_total, "forward");
  ASSERT_NE(forward, nullptr);
  EXPECT_EQ(forward->count, 10u);
  EXPECT_DOUBLE_EQ(forward->total_ns, 220 * kMsNs);
  EXPECT_DOUBLE_EQ(forward->self_ns, 82.5 * kMsNs);
  EXPECT_DOUBLE_EQ(forward->mean_ns, 22 * kMsNs);
  EXPECT_DOUBLE_EQ(forward->share, 220.0 / 800);
  const auto* matmul = Find(s.top_total, "matmul");
  ASSERT_NE(matmul, nullptr);
  EXPECT_NEAR(matmul->self_ns, 137.5 * kMsNs, 1e-2);
  // The step's self time: 550 - 220 - 165 ms.
  const auto* train = Find(s.top_total, "train");
  ASSERT_NE(train, nullptr);
  EXPECT_DOUBLE_EQ(train->total_ns, 550 * kMsNs);
  EXPECT_DOUBLE_EQ(train->self_ns, 165 * kMsNs);
  // Ordered: by total, and by self.
  EXPECT_EQ(s.top_total[0].name, "train");
  EXPECT_EQ(s.top_self[0].name, "backward");  // 165 ms, ties with train broken by name
  // Threads: main busy for the 550 ms of steps, loader 50 ms.
  ASSERT_EQ(s.threads.size(), 2u);
  EXPECT_EQ(s.threads[0].name, "main");
  EXPECT_DOUBLE_EQ(s.threads[0].busy_ns, 550 * kMsNs);
  EXPECT_EQ(s.threads[1].name, "loader");
  EXPECT_DOUBLE_EQ(s.threads[1].busy_ns, 50 * kMsNs);
  EXPECT_EQ(s.threads[0].events, 40u);
  // GPU kernels and copies.
  ASSERT_EQ(s.kernels.size(), 1u);
  EXPECT_EQ(s.kernels[0].name, "gemm_kernel");
  EXPECT_EQ(s.kernels[0].count, 10u);
  EXPECT_DOUBLE_EQ(s.kernels[0].total_ns, 20 * kMsNs);
  ASSERT_EQ(s.copies.size(), 1u);
  EXPECT_EQ(s.copies[0].name, "MemcpyH2D");
  EXPECT_DOUBLE_EQ(s.copies[0].total_ns, 5 * kMsNs);
  // The counter's peak and when.
  ASSERT_EQ(s.counters.size(), 1u);
  EXPECT_EQ(s.counters[0].name, "memory host");
  EXPECT_DOUBLE_EQ(s.counters[0].peak, 500);
  EXPECT_DOUBLE_EQ(s.counters[0].peak_at_ns, 7 * kMsNs);
  EXPECT_DOUBLE_EQ(s.counters[0].last, 300);
  EXPECT_TRUE(s.counters[0].bytes);  // its value is live_bytes
  // Drops and warnings.
  ASSERT_EQ(s.dropped.size(), 1u);
  EXPECT_EQ(s.dropped[0].name, "dropped_events");
  EXPECT_EQ(s.dropped[0].value, 3u);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_EQ(s.hostnames, std::vector<std::string>{"hostA"});
  EXPECT_EQ(s.events, 10u * 5 + 3 + 15);

  // JSON carries the same numbers.
  std::string json = analysis::SummaryToJson(s);
  EXPECT_NE(json.find("\"p50_ns\":55000000"), std::string::npos) << json.substr(0, 400);
  EXPECT_NE(json.find("\"name\":\"forward\",\"thread\":\"\",\"count\":10,\"total_ns\":220000000,\"self_ns\":82500000"),
            std::string::npos);
  EXPECT_NE(json.find("\"name\":\"memory host\",\"samples\":"), std::string::npos);
  EXPECT_NE(json.find("\"last\":300,\"unit\":\"bytes\""), std::string::npos) << json;
  // Text fits 100 columns.
  std::string text = analysis::SummaryToText(s, 100);
  EXPECT_NE(text.find("500 B"), std::string::npos) << text;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    EXPECT_LE(end - start, 100u) << text.substr(start, end - start);
    start = end + 1;
  }
}

// A recursive annotation (fib inside fib inside fib, with "add" between):
// its total is the outermost call's time, not the sum over the nesting
// (which made a share of wall time over 100%); self times and the mean per
// call are per event. Written in order and shuffled (the sorted second pass).
TEST(Summary, RecursionCountedOnce) {
  std::string dir = testing::MakeTempDir();
  for (bool shuffle : {false, true}) {
    tp::XSpace space;
    tp::XPlane* host = space.add_planes();
    host->set_name("/host:CPU");
    for (auto [id, name] : {std::pair{1, "fib"}, std::pair{2, "add"}}) {
      auto& m = (*host->mutable_event_metadata())[id];
      m.set_id(id);
      m.set_name(name);
    }
    tp::XLine* line = host->add_lines();
    line->set_id(1);
    line->set_name("main");
    // fib [0,100) holds fib [10,60) holds add [20,50) holds fib [25,35).
    for (auto [md, start, dur] : {std::tuple{1, 0, 100}, std::tuple{1, 10, 50}, std::tuple{2, 20, 30}, std::tuple{1, 25, 10}}) {
      tp::XEvent* e = line->add_events();
      e->set_metadata_id(md);
      e->set_offset_ps(start * kMs);
      e->set_duration_ps(dur * kMs);
    }
    if (shuffle) line->mutable_events()->SwapElements(0, 3);
    tp::XPlane* env = space.add_planes();
    env->set_name("Task Environment");
    for (auto [id, name, v] : {std::tuple{1, "profile_start_time", uint64_t{1'000'000'000'000'000'000}},
                               std::tuple{2, "profile_stop_time", uint64_t{1'000'000'000'000'000'000 + 200'000'000}}}) {
      auto& m = (*env->mutable_stat_metadata())[id];
      m.set_id(id);
      m.set_name(name);
      tp::XStat* st = env->add_stats();
      st->set_metadata_id(id);
      st->set_uint64_value(v);
    }
    Summary s;
    ASSERT_TRUE(analysis::Summarize(WriteFile(dir, shuffle ? "b.xplane.pb" : "a.xplane.pb", space.SerializeAsString()), {}, &s)
                    .ok());
    ASSERT_DOUBLE_EQ(s.wall_ns, 200 * kMsNs);
    const auto* fib = Find(s.top_total, "fib");
    ASSERT_NE(fib, nullptr) << shuffle;
    EXPECT_EQ(fib->count, 3u);
    EXPECT_DOUBLE_EQ(fib->total_ns, 100 * kMsNs) << shuffle;  // was 160 ms
    EXPECT_DOUBLE_EQ(fib->share, 0.5) << shuffle;              // was 0.8
    EXPECT_DOUBLE_EQ(fib->self_ns, 80 * kMsNs) << shuffle;     // 50 + 20 + 10
    EXPECT_DOUBLE_EQ(fib->mean_ns, 160.0 / 3 * kMsNs) << shuffle;
    const auto* add = Find(s.top_total, "add");
    ASSERT_NE(add, nullptr);
    EXPECT_DOUBLE_EQ(add->total_ns, 30 * kMsNs);
    EXPECT_DOUBLE_EQ(add->self_ns, 20 * kMsNs);
    ASSERT_EQ(s.threads.size(), 1u);
    const auto* fib_main = Find(s.threads[0].top_total, "fib");
    ASSERT_NE(fib_main, nullptr);
    EXPECT_DOUBLE_EQ(fib_main->total_ns, 100 * kMsNs);
    EXPECT_LE(fib_main->total_ns, s.threads[0].busy_ns);
  }
}

TEST(Summary, UnsortedLinesGiveTheSameNumbers) {
  std::string dir = testing::MakeTempDir();
  analysis::SummaryOptions o;
  o.top = 0;
  Summary sorted, shuffled;
  ASSERT_TRUE(analysis::Summarize(WriteKnown(dir, "a.xplane.pb"), o, &sorted).ok());
  ASSERT_TRUE(analysis::Summarize(WriteKnown(dir, "b.xplane.pb", {.shuffle = true}), o, &shuffled).ok());
  for (const char* name : {"train", "forward", "matmul", "backward"}) {
    const auto* a = Find(sorted.top_total, name);
    const auto* b = Find(shuffled.top_total, name);
    ASSERT_TRUE(a && b) << name;
    EXPECT_EQ(a->count, b->count) << name;
    EXPECT_DOUBLE_EQ(a->total_ns, b->total_ns) << name;
    EXPECT_DOUBLE_EQ(a->self_ns, b->self_ns) << name;
  }
  EXPECT_DOUBLE_EQ(shuffled.threads[0].busy_ns, 550 * kMsNs);
  EXPECT_DOUBLE_EQ(shuffled.steps.duration.p99_ns, sorted.steps.duration.p99_ns);
  ASSERT_EQ(shuffled.steps.all.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(shuffled.steps.all[i].number, static_cast<int64_t>(i));
  EXPECT_EQ(shuffled.steps.slowest[0].number, 9);
}

TEST(Summary, StepAndThreadFilters) {
  std::string dir = testing::MakeTempDir();
  std::string path = WriteKnown(dir, "host.xplane.pb");
  analysis::SummaryOptions o;
  o.top = 0;
  o.step_first = 3;
  o.step_last = 4;  // 40 and 50 ms
  Summary s;
  ASSERT_TRUE(analysis::Summarize(path, o, &s).ok());
  EXPECT_EQ(s.steps.duration.count, 2u);
  EXPECT_DOUBLE_EQ(s.steps.duration.mean_ns, 45 * kMsNs);
  EXPECT_DOUBLE_EQ(s.wall_ns, 90 * kMsNs);
  const auto* forward = Find(s.top_total, "forward");
  ASSERT_NE(forward, nullptr);
  EXPECT_EQ(forward->count, 2u);
  EXPECT_DOUBLE_EQ(forward->total_ns, 36 * kMsNs);

  analysis::SummaryOptions t;
  t.thread = "load";
  Summary only;
  ASSERT_TRUE(analysis::Summarize(path, t, &only).ok());
  ASSERT_EQ(only.threads.size(), 1u);
  EXPECT_EQ(only.threads[0].name, "loader");
  ASSERT_EQ(only.top_total.size(), 1u);
  EXPECT_EQ(only.top_total[0].name, "load");
  EXPECT_EQ(only.steps.duration.count, 10u);  // steps are found on every thread
}

TEST(Diff, FindsTheAnnotationMadeTwiceAsSlow) {
  std::string dir = testing::MakeTempDir();
  analysis::DiffOptions o;
  o.fail_above_pct = 10;
  o.annotations = {"backward"};
  analysis::Diff d;
  ASSERT_TRUE(
      analysis::DiffRuns(WriteKnown(dir, "base.xplane.pb"), WriteKnown(dir, "new.xplane.pb", {.matmul_scale = 2}), o, &d)
          .ok());
  EXPECT_TRUE(d.per_step);
  // By total time its parents grew as much; the bigger relative change leads.
  ASSERT_GE(d.annotations.size(), 3u);
  EXPECT_EQ(d.annotations[0].name, "matmul");
  EXPECT_EQ(d.annotations[0].delta_ns, 13.75 * kMsNs);
  EXPECT_EQ(d.annotations[1].name, "forward");
  // Self time isolates it: matmul +100%, nothing else moved.
  ASSERT_FALSE(d.self.empty());
  EXPECT_EQ(d.self[0].name, "matmul");
  EXPECT_NEAR(d.self[0].delta_pct, 100, 1e-6);
  EXPECT_NEAR(d.self[0].base_ns, 13.75 * kMsNs, 1);  // per step
  EXPECT_NEAR(d.self[0].new_ns, 27.5 * kMsNs, 1);
  for (size_t i = 1; i < d.self.size(); ++i) EXPECT_NEAR(d.self[i].delta_ns, 0, 1) << d.self[i].name;
  // Steps grew by matmul's 25%: above the gate.
  ASSERT_FALSE(d.steps.empty());
  EXPECT_EQ(d.steps[0].name, "step mean");
  EXPECT_NEAR(d.steps[0].delta_pct, 25, 1e-6);
  ASSERT_EQ(d.failures.size(), 1u);
  EXPECT_NE(d.failures[0].find("step time regressed +25.0%"), std::string::npos) << d.failures[0];
  EXPECT_FALSE(d.gate_error);
  // Counter peaks side by side (the same here).
  ASSERT_EQ(d.counters.size(), 1u);
  EXPECT_EQ(d.counters[0].name, "memory host");
  EXPECT_EQ(d.counters[0].base_ns, 500);
  EXPECT_EQ(d.counters[0].delta_ns, 0);
  EXPECT_TRUE(d.counters[0].bytes);
  // Noise from the spread of step times (10..100 ms): large here.
  EXPECT_GT(d.noise_pct, 10);
}

TEST(Diff, NothingChangedPassesTheGate) {
  std::string dir = testing::MakeTempDir();
  analysis::DiffOptions o;
  o.fail_above_pct = 0;
  o.annotations = {"matmul", "load"};
  analysis::Diff d;
  ASSERT_TRUE(analysis::DiffRuns(WriteKnown(dir, "a.xplane.pb"), WriteKnown(dir, "b.xplane.pb"), o, &d).ok());
  EXPECT_TRUE(d.failures.empty()) << d.failures[0];
  for (const auto& r : d.annotations) EXPECT_EQ(r.delta_ns, 0) << r.name;
  std::string json = analysis::DiffToJson(d);
  EXPECT_NE(json.find("\"passed\":true"), std::string::npos);
}

TEST(Diff, NamedAnnotationGate) {
  std::string dir = testing::MakeTempDir();
  analysis::DiffOptions o;
  o.fail_above_pct = 30;  // steps: +25%, under it
  o.annotations = {"matmul"};
  analysis::Diff d;
  ASSERT_TRUE(analysis::DiffRuns(WriteKnown(dir, "a.xplane.pb"), WriteKnown(dir, "b.xplane.pb", {.matmul_scale = 2}), o,
                                 &d)
                  .ok());
  ASSERT_EQ(d.failures.size(), 1u);
  EXPECT_NE(d.failures[0].find("annotation 'matmul' regressed +100.0%"), std::string::npos) << d.failures[0];
  o.annotations = {"no such"};
  ASSERT_TRUE(analysis::DiffRuns(WriteKnown(dir, "a.xplane.pb"), WriteKnown(dir, "a.xplane.pb"), o, &d).ok());
  EXPECT_TRUE(d.gate_error);
}

// --- the read API and its errors ------------------------------------------------

TEST(ProfileReader, ReadsTheWholeModel) {
  std::string dir = testing::MakeTempDir();
  profile::ProfileReader r;
  ASSERT_TRUE(r.Open(WriteKnown(dir, "h.xplane.pb")).ok());
  profile::ProfileData data;
  ASSERT_TRUE(r.Read(&data).ok());
  std::optional<profile::ProfilePlane> host = data.find_plane("/host:CPU");
  ASSERT_TRUE(host);
  ASSERT_GE(host->line_count(), 1u);
  profile::ProfileLine main = host->line(0);
  EXPECT_EQ(main.name(), "main");
  ASSERT_EQ(main.event_count(), 40u);
  profile::ProfileEvent step = main.event(0);
  EXPECT_EQ(step.name(), "train");
  EXPECT_EQ(step.start_ns(), 0);
  EXPECT_EQ(step.duration_ns(), 10'000'000);
  bool found = false;
  for (const profile::ProfileStat& s : step.stats()) found |= s.name == "step_num" && s.i64 == 0;
  EXPECT_TRUE(found);
  EXPECT_EQ(data.hostnames(), std::vector<std::string>{"hostA"});
  EXPECT_EQ(data.event_count(), 68u);
}

Status OpenError(const std::string& path) {
  profile::ProfileReader r;
  Status s = r.Open(path);
  if (!s.ok()) return s;
  struct Null : profile::ProfileVisitor {
  } v;
  return r.Scan(v);
}

TEST(ProfileReader, ClearErrors) {
  std::string dir = testing::MakeTempDir();
  Status s = OpenError(WriteFile(dir, "text.xplane.pb", "this is a text file, not a profile\n"));
  EXPECT_NE(s.message().find("is not a profile"), std::string::npos) << s.message();
  s = OpenError(WriteFile(dir, "empty.xplane.pb", ""));
  EXPECT_NE(s.message().find("is empty"), std::string::npos) << s.message();
  s = OpenError(WriteFile(dir, "gz.xplane.pb", std::string("\x1f\x8b\x08\x00", 4) + "xxxx"));
  EXPECT_NE(s.message().find("gzip"), std::string::npos) << s.message();
  std::string bytes = KnownSpace({}).SerializeAsString();
  for (size_t cut : {bytes.size() / 2, bytes.size() - 1, size_t{3}}) {
    s = OpenError(WriteFile(dir, "cut.xplane.pb", bytes.substr(0, cut)));
    EXPECT_NE(s.message().find("is truncated"), std::string::npos) << cut << ": " << s.message();
  }
  // A newer format: /host:metadata says so.
  tp::XSpace newer = KnownSpace({});
  tp::XPlane* md = newer.add_planes();
  md->set_name("/host:metadata");
  auto& sm = (*md->mutable_stat_metadata())[1];
  sm.set_id(1);
  sm.set_name("spyglass_format_version");
  auto* v = md->add_stats();
  v->set_metadata_id(1);
  v->set_int64_value(profile::kProfileFormatVersion + 1);
  s = OpenError(WriteFile(dir, "newer.xplane.pb", newer.SerializeAsString()));
  EXPECT_NE(s.message().find("newer format"), std::string::npos) << s.message();
  v->set_int64_value(profile::kProfileFormatVersion);
  EXPECT_TRUE(OpenError(WriteFile(dir, "same.xplane.pb", newer.SerializeAsString())).ok());
  s = OpenError(dir + "/missing.xplane.pb");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
}

TEST(ProfileReader, RandomBytesNeverCrash) {
  std::string dir = testing::MakeTempDir();
  std::string bytes = KnownSpace({}).SerializeAsString();
  std::mt19937 rng(1);
  for (int i = 0; i < 300; ++i) {
    std::string b = bytes;
    for (int k = 0; k < 1 + i % 8; ++k) b[rng() % b.size()] = static_cast<char>(rng());
    std::string path = WriteFile(dir, "fuzz.xplane.pb", b);
    Summary s;
    (void)analysis::Summarize(path, {}, &s);  // an error or a summary, never a crash
  }
}

TEST(FindProfileFiles, RunFolderAndLogDir) {
  std::string dir = testing::MakeTempDir();
  std::filesystem::create_directories(dir + "/plugins/profile/2026_01_01_00_00_00");
  std::filesystem::create_directories(dir + "/plugins/profile/2026_01_02_00_00_00");
  WriteKnown(dir + "/plugins/profile/2026_01_01_00_00_00", "old.xplane.pb");
  std::string newest = WriteKnown(dir + "/plugins/profile/2026_01_02_00_00_00", "new.xplane.pb");
  auto t = std::filesystem::last_write_time(dir + "/plugins/profile/2026_01_01_00_00_00");
  std::filesystem::last_write_time(dir + "/plugins/profile/2026_01_02_00_00_00", t + std::chrono::seconds(5));
  std::vector<std::string> files;
  ASSERT_TRUE(profile::FindProfileFiles(dir, &files).ok());
  EXPECT_EQ(files, std::vector<std::string>{newest});
  Status s = profile::FindProfileFiles(dir + "/plugins", &files);
  EXPECT_FALSE(s.ok());
}

TEST(Summary, RunFolderWithTwoHosts) {
  std::string dir = testing::MakeTempDir();
  WriteKnown(dir, "hostA.xplane.pb");
  WriteKnown(dir, "hostB.xplane.pb", {.matmul_scale = 2, .gpu = false});
  Summary s;
  ASSERT_TRUE(analysis::Summarize(dir, {}, &s).ok());
  EXPECT_EQ(s.file, dir);
  EXPECT_EQ(s.events, 68u + 53u);
  ASSERT_EQ(s.threads.size(), 4u);  // main and loader of each host, named by host
  std::vector<std::string> names;
  for (const auto& t : s.threads) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"hostA loader", "hostA main", "hostB loader", "hostB main"}));
  EXPECT_EQ(s.hostnames.size(), 2u);
  EXPECT_EQ(s.steps.duration.count, 10u);  // the first host's steps
  // All-thread tables summed over hosts: matmul 137.5 + 275 ms.
  const auto* matmul = Find(s.top_total, "matmul");
  ASSERT_NE(matmul, nullptr);
  EXPECT_EQ(matmul->count, 20u);
  EXPECT_NEAR(matmul->total_ns, 412.5 * kMsNs, 1e-3);
  EXPECT_DOUBLE_EQ(matmul->share, 412.5 / 800);
  ASSERT_EQ(s.kernels.size(), 1u);  // hostB has no GPU
}

// --- the CLI --------------------------------------------------------------------

struct CliResult {
  int code;
  std::string out;
};

CliResult Cli(const std::string& args) {
  std::string cmd = std::string(SPYGLASS_CLI) + " " + args + " 2>&1";
  CliResult r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(Cli, SummaryAndDiffExitCodes) {
  std::string dir = testing::MakeTempDir();
  std::string base = WriteKnown(dir, "base.xplane.pb");
  std::string same = WriteKnown(dir, "same.xplane.pb");
  std::string slow = WriteKnown(dir, "slow.xplane.pb", {.matmul_scale = 2});
  CliResult r = Cli("summary " + base);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("train"), std::string::npos);
  EXPECT_NE(r.out.find("55.00 ms"), std::string::npos) << r.out;  // mean and p50
  EXPECT_NE(r.out.find("gemm_kernel"), std::string::npos);
  EXPECT_NE(r.out.find("dropped_events (/host:CPU): 3"), std::string::npos);
  r = Cli("summary --json --top 2 " + base);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.front(), '{');
  EXPECT_NE(r.out.find("\"p99_ns\":99100000"), std::string::npos) << r.out.substr(0, 600);
  r = Cli("summary --step 9 --json " + base);
  EXPECT_NE(r.out.find("\"count\":1,\"total_ns\":100000000"), std::string::npos) << r.out.substr(0, 600);
  r = Cli("summary --step x " + base);
  EXPECT_EQ(r.code, 2);

  EXPECT_EQ(Cli("diff --fail-above 10 " + base + " " + same).code, 0);
  r = Cli("diff --fail-above 10 " + base + " " + slow);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("step time regressed"), std::string::npos) << r.out;
  r = Cli("diff --fail-above 30 --annotation matmul " + base + " " + slow);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("'matmul' regressed +100.0%"), std::string::npos) << r.out;
  EXPECT_EQ(Cli("diff --fail-above 30 --annotation load " + base + " " + slow).code, 0);
  r = Cli("diff " + base + " " + slow);  // no gate: a report, exit 0
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("matmul"), std::string::npos);

  std::string text = WriteFile(dir, "notes.xplane.pb", "hello\n");
  r = Cli("summary " + text);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("is not a profile"), std::string::npos) << r.out;
  r = Cli("diff " + base + " " + text);
  EXPECT_EQ(r.code, 2);
  std::string bytes = testing::ReadFile(base);
  r = Cli("summary " + WriteFile(dir, "cut.xplane.pb", bytes.substr(0, bytes.size() - 10)));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("is truncated"), std::string::npos) << r.out;
}

// A gated annotation that the new run no longer has (renamed, or no longer
// run) fails the gate: it did not get faster, it can no longer be measured.
TEST(Diff, GatedAnnotationGoneFromTheNewRunFails) {
  std::string dir = testing::MakeTempDir();
  std::string base = WriteKnown(dir, "base.xplane.pb");
  std::string gone = WriteKnown(dir, "gone.xplane.pb", {.loader = false});
  analysis::DiffOptions o;
  o.fail_above_pct = 10;
  o.annotations = {"load"};
  analysis::Diff d;
  ASSERT_TRUE(analysis::DiffRuns(base, gone, o, &d).ok());
  EXPECT_TRUE(d.gate_error);
  ASSERT_EQ(d.failures.size(), 1u);
  EXPECT_NE(d.failures[0].find("annotation 'load' is not in the new run (10 in the base)"), std::string::npos)
      << d.failures[0];
  CliResult r = Cli("diff --fail-above 10 --annotation load " + base + " " + gone);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("'load' is not in the new run"), std::string::npos) << r.out;
  EXPECT_EQ(Cli("diff --fail-above 10 --annotation load " + base + " " + base).code, 0);
}

// --step or --thread that select nothing: an error naming what there is,
// not empty tables.
// A sampled run built as the sampler writes one (sampling/cpu_model.h): two
// steps on "main" (tid 7), samples on main and on "worker" (tid 8), stacks
// main > work > burn_a | burn_b, and a Python frame between main and work.
// `shifted`: main's first two samples in burn_b, not burn_a (a second run).
std::string WriteSampledRun(const std::string& dir, bool shifted = false) {
  spyglass::model::Space space;
  namespace m = spyglass::model;
  namespace smp = spyglass::sampling;
  m::Plane& host = space.plane(m::kHostPlaneName);
  host.stats.push_back(host.int_stat(m::kProcessIdStat, 77));
  host.stats.push_back(host.uint_stat(smp::kCpuSamplePeriodStat, 1'000'000));
  int next = 0;
  auto node = [&](uint32_t parent, const char* fn, const char* file, bool python) {
    uint32_t id = host.intern_event(std::string(smp::kCpuStackNodePrefix) + std::to_string(next++));
    std::vector<m::Stat> st{host.ref_stat(smp::kCpuFrameStat, fn)};
    if (*file) st.push_back(host.ref_stat(smp::kCpuFileStat, file));
    if (parent) st.push_back(host.uint_stat(smp::kCpuParentStat, parent));
    st.push_back(host.ref_stat(smp::kCpuFrameKindStat, python ? "python" : "native"));
    host.event_metadata_at(id).display_name = fn;
    host.event_metadata_at(id).stats = std::move(st);
    return id;
  };
  uint32_t main_fn = node(0, "main", "main.cc", false);
  uint32_t step_py = node(main_fn, "train_step", "/src/train.py", true);
  uint32_t work = node(step_py, "work", "", false);
  uint32_t a = node(work, "burn_a", "", false), b = node(work, "burn_b", "", false);
  constexpr int64_t kMs = 1'000'000'000;  // ps
  m::Line& main_line = host.line_with_id(7);
  main_line.name = "main";
  for (int n : {1, 2}) {
    m::Event e;
    e.offset_ps = (n - 1) * 10 * kMs;
    e.duration_ps = 10 * kMs;
    e.metadata_id = host.intern_event("train");
    m::Stat st = host.int_stat(m::kStepNumStat, n);
    main_line.add_stats(e, std::span<const m::Stat>(&st, 1));
    main_line.events.push_back(e);
  }
  auto samples = [&](int64_t tid, const char* name, std::vector<std::pair<int64_t, uint32_t>> at) {
    m::Line& l = host.line_with_id(smp::kCpuSampleLineIdBase + tid);
    l.name = std::string(smp::kCpuSamplesLineName);
    l.display_name = std::string(name) + " " + std::to_string(tid) + " CPU samples";
    for (auto [ms, leaf] : at) {
      m::Event e;
      e.offset_ps = ms * kMs;
      e.duration_ps = kMs;
      e.metadata_id = leaf;
      l.events.push_back(e);
    }
  };
  samples(7, "main", {{1, shifted ? b : a}, {2, shifted ? b : a}, {3, a}, {12, b}, {13, a}});
  samples(8, "worker", {{5, b}});
  return WriteFile(dir, shifted ? "shifted.xplane.pb" : "sampled.xplane.pb",
                   spyglass::exporter::SerializeXSpace(space));
}

TEST(Cli, SummaryJsonHasTheCpuTables) {
  std::string dir = testing::MakeTempDir();
  std::string run = WriteSampledRun(dir);
  // Read back by json.load (valid JSON), one line per scope:
  // name|samples|cpu_ns|self rows (function:self_ns:share)|total rows (function:total_ns:share)
  WriteFile(dir, "scopes.py", R"PY(import json, sys
d = json.load(sys.stdin)
if "cpu" not in d:
  sys.exit("no cpu key: " + ",".join(d))
c = d["cpu"]
def rows(v, ns, share):
  return ",".join("%s%s:%d:%.3f" % (r["function"], "(py %s)" % r["file"] if r["python"] else "", r[ns], r[share])
                  for r in v)
print("samples", c["samples"], c["cpu_ns"])
for s in [c["all"]] + c["threads"] + c["steps"]:
  print("|".join([s["name"], str(s["samples"]), "%d" % s["cpu_ns"], rows(s["top_self"], "self_ns", "self_share"),
                  rows(s["top_total"], "total_ns", "total_share")]))
)PY");
  CliResult r = Cli("summary --json " + run + " | python3 " + dir + "/scopes.py");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("samples 6 6000000\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all threads|6|6000000|burn_a:4000000:0.667,burn_b:2000000:0.333|"
                       "main:6000000:1.000,train_step(py /src/train.py):6000000:1.000,work:6000000:1.000,"
                       "burn_a:4000000:0.667,burn_b:2000000:0.333\n"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("thread main 7|5|5000000|burn_a:4000000:0.800,burn_b:1000000:0.200|"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("thread worker 8|1|1000000|burn_b:1000000:1.000|"), std::string::npos) << r.out;
  EXPECT_LT(r.out.find("thread main 7"), r.out.find("thread worker 8"));  // most CPU first
  // Steps: samples of any thread inside step 1 [0, 10 ms) and step 2 [10, 20 ms).
  EXPECT_NE(r.out.find("step 1|4|4000000|burn_a:3000000:0.750,burn_b:1000000:0.250|"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 2|2|2000000|"), std::string::npos) << r.out;
  // --top applies to the CPU rows too.
  r = Cli("summary --json --top 1 " + run + " | python3 " + dir + "/scopes.py");
  EXPECT_NE(r.out.find("all threads|6|6000000|burn_a:4000000:0.667|main:6000000:1.000\n"), std::string::npos)
      << r.out;
  // A run without samples has no "cpu".
  r = Cli("summary --json " + WriteKnown(dir, "plain.xplane.pb"));
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.find("\"cpu\""), std::string::npos) << r.out.substr(0, 300);
}

TEST(Cli, DiffJsonHasTheCpuTablesOfBothRuns) {
  std::string dir = testing::MakeTempDir();
  std::string base = WriteSampledRun(dir), next = WriteSampledRun(dir, /*shifted=*/true);
  // Read back by json.load, one line per function:
  // function|base self|new self|delta self (ns)|the same as shares, then total shares.
  WriteFile(dir, "cpu_diff.py", R"PY(import json, sys
d = json.load(sys.stdin)
if "cpu" not in d:
  sys.exit("no cpu key: " + ",".join(d))
c = d["cpu"]
print("runs", c["base_samples"], c["new_samples"], "%d" % c["base_cpu_ns"], "%d" % c["new_cpu_ns"])
for r in c["functions"]:
  print("|".join([r["function"], "%d" % r["base_self_ns"], "%d" % r["new_self_ns"], "%d" % r["delta_self_ns"],
                  "%.3f" % r["base_self_share"], "%.3f" % r["new_self_share"], "%.3f" % r["delta_self_share"],
                  "%.3f" % r["base_total_share"], "%.3f" % r["new_total_share"], "%.3f" % r["delta_total_share"],
                  "%d/%d" % (r["base_samples"], r["new_samples"])]))
# Each run's own tables, as `summary --json` has them.
print("base cpu", d["base"]["cpu"]["samples"], d["base"]["cpu"]["all"]["top_self"][0]["function"])
print("new cpu", d["new"]["cpu"]["samples"], d["new"]["cpu"]["all"]["top_self"][0]["function"])
)PY");
  CliResult r = Cli("diff --json " + base + " " + next + " | python3 " + dir + "/cpu_diff.py");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("runs 6 6 6000000 6000000\n"), std::string::npos) << r.out;
  // burn_a 4 -> 2 samples, burn_b 2 -> 4: the biggest changes first; the callers' unchanged.
  EXPECT_NE(r.out.find("burn_a|4000000|2000000|-2000000|0.667|0.333|-0.333|0.667|0.333|-0.333|4/2\n"
                       "burn_b|2000000|4000000|2000000|0.333|0.667|0.333|0.333|0.667|0.333|2/4\n"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("work|0|0|0|0.000|0.000|0.000|1.000|1.000|0.000|6/6\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("base cpu 6 burn_a\nnew cpu 6 burn_b\n"), std::string::npos) << r.out;
  // --top cuts the function rows.
  r = Cli("diff --json --top 1 " + base + " " + next + " | python3 " + dir + "/cpu_diff.py");
  EXPECT_NE(r.out.find("burn_a|"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("burn_b|"), std::string::npos) << r.out;
  // The text diff names the same functions.
  r = Cli("diff " + base + " " + next);
  EXPECT_NE(r.out.find("CPU time by function"), std::string::npos) << r.out;
  // Runs without samples: no "cpu".
  std::string plain = WriteKnown(dir, "plain.xplane.pb");
  r = Cli("diff --json " + plain + " " + plain);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.find("\"cpu\""), std::string::npos) << r.out.substr(0, 300);
}

TEST(Cli, FiltersThatSelectNothingSayWhatThereIs) {
  std::string dir = testing::MakeTempDir();
  std::string base = WriteKnown(dir, "base.xplane.pb");
  CliResult r = Cli("summary --step 100:200 " + base);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("no step in --step 100:200; the run has 10 steps, numbered 0 to 9"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("Steps"), std::string::npos) << r.out;  // no tables
  r = Cli("summary --json --step 12 " + base);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("no step in --step 12; the run has 10 steps"), std::string::npos) << r.out;
  r = Cli("summary --step 3:4 " + base);
  EXPECT_EQ(r.code, 0) << r.out;
  r = Cli("summary --thread nosuch " + base);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("no thread matches --thread 'nosuch'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'main' (1)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'loader' (2)"), std::string::npos) << r.out;
  EXPECT_EQ(Cli("summary --thread load " + base).code, 0);
  r = Cli("diff --thread nosuch " + base + " " + base);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the base run: no thread matches"), std::string::npos) << r.out;
  r = Cli("diff --step 40 " + base + " " + base);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("numbered 0 to 9"), std::string::npos) << r.out;
}

// A file given to the wrong command: the message names the right one.
TEST(Cli, PointsToTheCommandThatReadsTheFile) {
  std::string dir = testing::MakeTempDir();
  std::string trace = WriteKnown(dir, "host.xplane.pb");
  memory::ProfileData d;
  d.functions.push_back({"Alloc", "Alloc", "/src/a.cc", 1});
  d.locations.push_back({0x10, {{1, 3}}});
  d.samples.push_back({{1}, 2, 64, "heap", "cpu:0"});
  std::string prof = WriteFile(dir, "memory.1.app.exit.prof", memory::EncodePprofGz(d));
  std::string tsv = WriteFile(dir, "memory.1.app.timeline.tsv",
                              "# spyglass memory timeline 1\n# start_monotonic_ns\t0\n# interval_ns\t1000000\nt_ns\n");
  CliResult r = Cli("summary " + prof);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is a memory profile (pprof), not a trace: read it with `spyglass memtop`"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("decompress"), std::string::npos) << r.out;
  r = Cli("summary " + tsv);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is a memory timeline: chart it with `spyglass memtop --over-time`"), std::string::npos)
      << r.out;
  r = Cli("memtop " + trace);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is a trace (.xplane.pb), not a memory profile: read it with `spyglass summary`"),
            std::string::npos)
      << r.out;
  r = Cli("memtop " + tsv);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--over-time"), std::string::npos) << r.out;
  r = Cli("memdiff " + prof + " " + trace);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("spyglass summary"), std::string::npos) << r.out;
  // What is neither keeps the reader's own message.
  r = Cli("memtop " + WriteFile(dir, "notes.txt", "hello\n"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("not a valid pprof profile"), std::string::npos) << r.out;
  EXPECT_EQ(Cli("memtop " + prof).code, 0);
}

// Hostile times: durations that add up past int64 (two threads, each an
// event of nearly INT64_MAX ps), a negative duration, an event at the end of
// int64: totals saturate instead of wrapping to negative.
TEST(Summary, HugeDurationsSaturate) {
  std::string dir = testing::MakeTempDir();
  tp::XSpace space;
  tp::XPlane* host = space.add_planes();
  host->set_name("/host:CPU");
  auto& m = (*host->mutable_event_metadata())[1];
  m.set_id(1);
  m.set_name("e");
  for (int t = 0; t < 2; ++t) {
    tp::XLine* line = host->add_lines();
    line->set_id(t + 1);
    line->set_name("t" + std::to_string(t));
    tp::XEvent* e = line->add_events();
    e->set_metadata_id(1);
    e->set_duration_ps(INT64_MAX - 1);
  }
  tp::XLine* odd = host->add_lines();
  odd->set_id(3);
  odd->set_name("odd");
  odd->set_timestamp_ns(INT64_MAX / 1000);
  for (int64_t dur : {int64_t{-5}, INT64_MAX}) {
    tp::XEvent* e = odd->add_events();
    e->set_metadata_id(1);
    e->set_duration_ps(dur);
  }
  Summary s;
  ASSERT_TRUE(analysis::Summarize(WriteFile(dir, "huge.xplane.pb", space.SerializeAsString()), {}, &s).ok());
  const auto* e = Find(s.top_total, "e");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->count, 4u);
  EXPECT_GT(e->total_ns, 9.2e15) << e->total_ns;  // INT64_MAX ps, saturated; it wrapped to a negative total
  EXPECT_GT(e->self_ns, 9.2e15) << e->self_ns;
  for (const auto& t : s.threads) EXPECT_GE(t.busy_ns, 0) << t.name;
}

}  // namespace
}  // namespace spyglass

// Counter values in tables: bytes in binary units; other numbers keep their
// fractions (a PM metric's 0.35 is not 0) and whole numbers stay whole.
TEST(Summary, CounterValuesKeepTheirUnitAndFractions) {
  using spyglass::analysis::FormatValue;
  EXPECT_EQ(FormatValue(500, true), "500 B");
  EXPECT_EQ(FormatValue(5.5 * (1 << 20), true), "5.50 MiB");
  EXPECT_EQ(FormatValue(3.0 * (1ull << 30), true), "3.00 GiB");
  EXPECT_EQ(FormatValue(0.35, false), "0.35");
  EXPECT_EQ(FormatValue(52.5, false), "52.5");
  EXPECT_EQ(FormatValue(2000000, false), "2000000");
  EXPECT_EQ(FormatValue(-7, false), "-7");
  EXPECT_EQ(FormatValue(1.0 / 3, false), "0.3333");
}

namespace spyglass {
namespace {

// Bytes a terminal acts on: C0 controls but the newline, DEL, and C1
// controls (U+0080..U+009F in UTF-8, or bare).
std::string ControlBytesIn(const std::string& text) {
  std::string found;
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    bool c1 = c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) < 0xa0;
    if ((c < 0x20 && c != '\n') || c == 0x7f || c1 || (c >= 0x80 && c < 0xa0))
      found += "byte " + std::to_string(c) + " at " + std::to_string(i) + "; ";
  }
  return found;
}

// The known trace, its names holding what terminals obey: a title change
// (OSC 0, ended by BEL), a clipboard write (OSC 52), "\r\e[K" that erases
// the line, a C1 CSI (U+009B), DEL and a newline that would forge a row.
tp::XSpace HostileNamesSpace() {
  tp::XSpace space = KnownSpace({});
  const std::string title = "\x1b]0;pwned\x07", clip = "\x1b]52;c;ZWNobyBoaQ==\x07", erase = "\r\x1b[K";
  for (tp::XPlane& p : *space.mutable_planes()) {
    for (auto& [id, m] : *p.mutable_event_metadata()) m.set_name(title + m.name() + erase + "\xc2\x9b" + "2J\x7f");
    for (tp::XLine& l : *p.mutable_lines())
      if (l.name() != "_counters_" && l.name().rfind("Stream", 0) != 0) l.set_name(clip + l.name() + "\nfake row");
  }
  space.set_hostnames(0, "host" + erase);
  space.add_errors("bad\x1b[2Jthing");
  return space;
}

TEST(Summary, TextOutputQuotesControlCharacters) {
  std::string dir = testing::MakeTempDir();
  std::string bytes = HostileNamesSpace().SerializeAsString();
  std::string base = WriteFile(dir, "base\x1b[31m.xplane.pb", bytes);
  std::string next = WriteFile(dir, "next.xplane.pb", bytes);
  Summary s;
  ASSERT_TRUE(analysis::Summarize(base, {}, &s).ok());
  ASSERT_FALSE(s.top_total.empty());
  std::string text = analysis::SummaryToText(s);
  EXPECT_EQ(ControlBytesIn(text), "") << text;
  EXPECT_NE(text.find("?]0;pwned?train??[K?2J?"), std::string::npos) << text;  // quoted, not dropped
  EXPECT_EQ(text.find("fake row\n"), std::string::npos) << text;

  analysis::Diff d;
  analysis::DiffOptions o;
  o.fail_above_pct = 1000;
  o.annotations = {"nope\x1b]0;x\x07"};
  ASSERT_TRUE(analysis::DiffRuns(base, next, o, &d).ok());
  text = analysis::DiffToText(d);
  EXPECT_EQ(ControlBytesIn(text), "") << text;
  EXPECT_NE(text.find("?]0;pwned?matmul"), std::string::npos) << text;

  CliResult r = Cli("summary '" + base + "'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(ControlBytesIn(r.out), "") << r.out;
  r = Cli("diff '" + base + "' " + next);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(ControlBytesIn(r.out), "") << r.out;
}

}  // namespace
}  // namespace spyglass


namespace spyglass {
namespace {

// A FIFO where a profile is expected: opening one for reading waited for a
// writer, for ever, in every reader. Each one now says what it is and fails.
TEST(ProfileReader, FifoIsAnErrorNotAHang) {
  std::string dir = testing::MakeTempDir();
  std::string fifo = dir + "/pipe.xplane.pb", prof = dir + "/pipe.prof";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(mkfifo(prof.c_str(), 0600), 0);
  std::string base = WriteKnown(dir, "base.xplane.pb");
  // Through the CLI first, each under a timeout (124: it hung).
  for (std::string args : {"summary " + fifo, "diff " + base + " " + fifo, "diff " + fifo + " " + base,
                           "report " + fifo + " -o " + dir + "/r.html",
                           "report " + base + " --memory " + prof + " -o " + dir + "/r.html", "memtop " + prof,
                           "memdiff " + prof + " " + prof}) {
    std::string cmd = "timeout 20 " + std::string(SPYGLASS_CLI) + " " + args + " 2>&1";
    CliResult r{-1, ""};
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    int st = pclose(p);
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    EXPECT_NE(r.code, 124) << args << ": hung";
    EXPECT_NE(r.code, 0) << args << ": " << r.out;
    EXPECT_NE(r.out.find("FIFO"), std::string::npos) << args << ": " << r.out;
  }
  // And in-process (the Python package's from_file is ReadXSpaceFile); a
  // hang is ended by the alarm.
  alarm(60);
  profile::ProfileReader reader;
  Status s = reader.Open(fifo);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find("is not a regular file but a FIFO"), std::string::npos) << s.message();
  model::Space space;
  s = model::ReadXSpaceFile(fifo, &space);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  memory::PprofProfile pp;
  s = memory::ReadPprofFile(prof, &pp);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  Summary sum;
  EXPECT_FALSE(analysis::Summarize(fifo, {}, &sum).ok());
  s = reader.Open("/dev/null");
  EXPECT_NE(s.message().find("is not a regular file but a device"), std::string::npos) << s.message();
  alarm(0);
}

// A profile truncated after it was opened: the mapping it is read through
// faulted (SIGBUS) on its first page past the new end and killed the reader.
// Now the reader fails with a clear error, for Read, Scan and the Python
// package's ReadXSpaceFile alike; and a SIGBUS elsewhere still kills.
TEST(ProfileReader, FileTruncatedWhileMappedIsAnError) {
  std::string dir = testing::MakeTempDir();
  tp::XSpace big = KnownSpace({});
  for (int i = 0; i < 20; ++i) big.MergeFrom(KnownSpace({}));  // several pages
  const std::string bytes = big.SerializeAsString();
  ASSERT_GT(bytes.size(), 3 * 4096u);
  std::string path = WriteFile(dir, "cut.xplane.pb", bytes);
  EXPECT_EXIT(
      {
        profile::ProfileReader reader;
        if (!reader.Open(path).ok()) _exit(2);
        if (truncate(path.c_str(), 4096) != 0) _exit(3);
        profile::ProfileData data;
        Status s = reader.Read(&data);
        if (s.ok() || s.message().find("changed while it was read") == std::string::npos) _exit(4);
        struct : profile::ProfileVisitor {
        } visitor;
        s = reader.Scan(visitor);
        if (s.ok() || s.message().find("changed while it was read") == std::string::npos) _exit(5);
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  WriteFile(dir, "cut.xplane.pb", bytes);
  EXPECT_EXIT(
      {
        profile::ProfileReader reader;  // the guard is in
        if (!reader.Open(path).ok()) _exit(2);
        raise(SIGBUS);  // not in a mapping: the handler before ours, the default one here
        _exit(0);
      },
      // Killed by SIGBUS; under ASan, whose handler was there before, its report and exit.
      [](int status) { return WIFSIGNALED(status) ? WTERMSIG(status) == SIGBUS : WEXITSTATUS(status) != 0; }, "");
}

// A file that shrinks and grows while it is read, again and again: each read
// gives a summary or a clear error, never a crash.
TEST(Summary, FileShrinkingWhileReadNeverCrashes) {
  std::string dir = testing::MakeTempDir();
  tp::XSpace big = KnownSpace({});
  for (int i = 0; i < 6; ++i) big.MergeFrom(KnownSpace({}));
  const std::string bytes = big.SerializeAsString();
  std::string path = WriteFile(dir, "moving.xplane.pb", bytes);
  std::atomic<bool> stop{false};
  std::thread cutter([&] {
    size_t n = 0;
    while (!stop) {
      if (truncate(path.c_str(), static_cast<off_t>(n % bytes.size())) != 0) break;
      std::ofstream(path, std::ios::binary | std::ios::app) << bytes.substr(n % bytes.size());
      n += 4099;
    }
  });
  int ok = 0, failed = 0;
  for (int i = 0; i < 200; ++i) {
    Summary s;
    model::Space space;
    for (Status st : {analysis::Summarize(path, {}, &s), model::ReadXSpaceFile(path, &space)}) {
      if (st.ok()) {
        ++ok;
      } else {
        ++failed;
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
      }
    }
  }
  stop = true;
  cutter.join();
  EXPECT_EQ(ok + failed, 400);
}

}  // namespace
}  // namespace spyglass

namespace spyglass {
namespace {

// Thread t<i> busy i ms, for i in 1..n.
std::string WriteManyThreads(const std::string& dir, int n) {
  tp::XSpace space;
  tp::XPlane* host = space.add_planes();
  host->set_name("/host:CPU");
  auto& m = (*host->mutable_event_metadata())[1];
  m.set_id(1);
  m.set_name("work");
  for (int i = 1; i <= n; ++i) {
    tp::XLine* l = host->add_lines();
    l->set_id(i);
    l->set_name("t" + std::to_string(i));
    tp::XEvent* e = l->add_events();
    e->set_metadata_id(1);
    e->set_duration_ps(i * kMs);
  }
  return WriteFile(dir, "threads.xplane.pb", space.SerializeAsString());
}

// --top bounds the Threads table too (--top 2 printed a row per thread:
// 300,018 lines for 300k threads), and the text says how many were left out.
TEST(Summary, ThreadsHonourTop) {
  std::string dir = testing::MakeTempDir();
  std::string path = WriteManyThreads(dir, 300);
  analysis::SummaryOptions o;
  o.top = 2;
  Summary s;
  ASSERT_TRUE(analysis::Summarize(path, o, &s).ok());
  ASSERT_EQ(s.threads.size(), 2u);
  EXPECT_EQ(s.threads[0].name, "t300");
  EXPECT_EQ(s.threads[1].name, "t299");
  EXPECT_EQ(s.threads_left_out, 298u);
  std::string text = analysis::SummaryToText(s);
  EXPECT_NE(text.find("298 more threads not shown"), std::string::npos) << text;
  EXPECT_EQ(text.find("t298"), std::string::npos) << text;
  EXPECT_NE(analysis::SummaryToJson(s).find("\"threads_left_out\":298"), std::string::npos);
  CliResult r = Cli("summary --top 2 " + path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_LT(std::count(r.out.begin(), r.out.end(), '\n'), 40) << r.out;
  o.top = 0;  // all
  ASSERT_TRUE(analysis::Summarize(path, o, &s).ok());
  EXPECT_EQ(s.threads.size(), 300u);
  EXPECT_EQ(s.threads_left_out, 0u);
}

}  // namespace
}  // namespace spyglass

namespace spyglass {
namespace {

// Steps "train" of `step_ms` ms each (step_num 0..n-1), then the odd ones
// `odd` adds; a live-bytes counter with the samples `counter`.
std::string WriteSteps(const std::string& dir, const std::string& name, int n, int64_t step_ms,
                       const std::function<void(tp::XLine*)>& odd, std::vector<double> counter = {}) {
  tp::XSpace space;
  tp::XPlane* host = space.add_planes();
  host->set_name("/host:CPU");
  for (auto [id, n] : {std::pair{1, "train"}, std::pair{2, "memory"}}) {
    auto& m = (*host->mutable_event_metadata())[id];
    m.set_id(id);
    m.set_name(n);
  }
  for (auto [id, n] : {std::pair{1, "step_num"}, std::pair{2, "live_bytes"}}) {
    auto& m = (*host->mutable_stat_metadata())[id];
    m.set_id(id);
    m.set_name(n);
  }
  tp::XLine* main = host->add_lines();
  main->set_id(1);
  main->set_name("main");
  for (int i = 0; i < n; ++i) {
    tp::XEvent* e = main->add_events();
    e->set_metadata_id(1);
    e->set_offset_ps(i * step_ms * kMs);
    e->set_duration_ps(step_ms * kMs);
    tp::XStat* s = e->add_stats();
    s->set_metadata_id(1);
    s->set_int64_value(i);
  }
  odd(main);
  tp::XLine* counters = host->add_lines();
  counters->set_id(2);
  counters->set_name("_counters_");
  for (size_t i = 0; i < counter.size(); ++i) {
    tp::XEvent* e = counters->add_events();
    e->set_metadata_id(2);
    e->set_offset_ps(static_cast<int64_t>(i) * kMs);
    tp::XStat* s = e->add_stats();
    s->set_metadata_id(2);
    s->set_double_value(counter[i]);
  }
  return WriteFile(dir, name, space.SerializeAsString());
}

tp::XEvent* OddStep(tp::XLine* l, int64_t start_ps, int64_t dur_ps) {
  tp::XEvent* e = l->add_events();
  e->set_metadata_id(1);
  e->set_offset_ps(start_ps);
  e->set_duration_ps(dur_ps);
  return e;
}

uint64_t DroppedValue(const Summary& s, const std::string& name) {
  for (const auto& d : s.dropped)
    if (d.name.find(name) != std::string::npos) return d.value;
  return 0;
}

// A negative step duration (a mean of -2,305,843 s, negative bars, a gate
// that passed), a step_num that is NaN, infinite or past int64 (converted
// with undefined behaviour to INT64_MIN), a counter sample that is NaN ("nan
// B" as the peak): left out, and counted in the dropped table.
TEST(Summary, NonsenseValuesAreLeftOutAndCounted) {
  std::string dir = testing::MakeTempDir();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  std::string odd = WriteSteps(
      dir, "odd.xplane.pb", 5, 20,
      [&](tp::XLine* l) {
        tp::XStat* n = OddStep(l, 200 * kMs, -INT64_MAX / 4)->add_stats();  // step 5, negative
        n->set_metadata_id(1);
        n->set_int64_value(5);
        for (double bad : {nan, inf, -inf, 1e30}) {
          tp::XStat* s = OddStep(l, 300 * kMs, kMs)->add_stats();
          s->set_metadata_id(1);
          s->set_double_value(bad);
        }
      },
      {nan, 100, inf, 50});
  Summary s;
  ASSERT_TRUE(analysis::Summarize(odd, {}, &s).ok());
  EXPECT_EQ(s.steps.duration.count, 5u);
  EXPECT_DOUBLE_EQ(s.steps.duration.mean_ns, 20 * kMsNs);
  EXPECT_GE(s.steps.duration.min_ns, 0);
  for (const auto& st : s.steps.all) {
    EXPECT_GE(st.number, 0);
    EXPECT_LE(st.number, 4);
    EXPECT_GE(st.duration_ns, 0);
  }
  EXPECT_EQ(DroppedValue(s, "steps with a negative duration"), 1u);
  EXPECT_EQ(DroppedValue(s, "step_num is not an integer in range"), 4u);
  ASSERT_EQ(s.counters.size(), 1u);
  EXPECT_EQ(s.counters[0].peak, 100);
  EXPECT_EQ(s.counters[0].samples, 2u);
  EXPECT_EQ(DroppedValue(s, "counter samples that are not finite"), 2u);
  std::string text = analysis::SummaryToText(s);
  EXPECT_EQ(text.find("nan"), std::string::npos) << text;
  EXPECT_EQ(text.find("inf "), std::string::npos) << text;
  EXPECT_NE(text.find("steps with a negative duration (left out): 1"), std::string::npos) << text;

  // The gate: 10 ms steps, then 20 ms steps and one hugely negative step,
  // whose mean was negative: "passed".
  std::string base = WriteSteps(dir, "base.xplane.pb", 5, 10, [](tp::XLine*) {});
  analysis::Diff d;
  analysis::DiffOptions o;
  o.fail_above_pct = 10;
  ASSERT_TRUE(analysis::DiffRuns(base, odd, o, &d).ok());
  ASSERT_FALSE(d.steps.empty());
  EXPECT_NEAR(d.steps[0].delta_pct, 100, 1e-9);
  ASSERT_EQ(d.failures.size(), 1u);
  EXPECT_NE(d.failures[0].find("step time regressed +100.0%"), std::string::npos) << d.failures[0];
  CliResult r = Cli("diff --fail-above 10 " + base + " " + odd);
  EXPECT_EQ(r.code, 1) << r.out;
}

// Names that are not UTF-8: the CLI reads such a file, and the Python
// package's from_file (ReadXSpaceFile) refused it as "truncated, or not a
// .xplane.pb". It reads it now, each bad byte as U+FFFD, with a warning.
TEST(ProfileReader, InvalidUtf8NamesAreReadEverywhere) {
  std::string dir = testing::MakeTempDir();
  tp::XSpace space = KnownSpace({});
  tp::XPlane* host = space.mutable_planes(0);
  (*host->mutable_event_metadata())[3].set_name("BAD1matmul");
  host->mutable_lines(0)->set_name("BAD2main");
  host->set_name("/host:CPU");
  tp::XStat* str = host->mutable_lines(0)->mutable_events(0)->add_stats();
  str->set_metadata_id(2);
  str->set_str_value("BAD3");
  space.add_warnings("BAD4");
  std::string bytes = space.SerializeAsString();
  for (const char* mark : {"BAD1", "BAD2", "BAD3", "BAD4"}) {
    size_t at = bytes.find(mark);
    ASSERT_NE(at, std::string::npos) << mark;
    bytes.replace(at, 4, "\xff\xc0\x80\xed");  // a bad byte, an overlong NUL, a lone lead byte
  }
  std::string path = WriteFile(dir, "utf8.xplane.pb", bytes);
  Summary s;
  ASSERT_TRUE(analysis::Summarize(path, {}, &s).ok());  // the CLI's reader
  model::Space read;
  Status st = model::ReadXSpaceFile(path, &read);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(read.planes.size(), 3u);
  const std::string bad = "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd";
  bool found = false;
  for (const auto& md : read.planes[0].event_metadata()) found |= md.name == bad + "matmul";
  EXPECT_TRUE(found);
  EXPECT_EQ(read.planes[0].lines[0].name, bad + "main");
  ASSERT_FALSE(read.warnings.empty());
  EXPECT_NE(read.warnings.back().find("4 strings of the profile"), std::string::npos) << read.warnings.back();
  // The whole-message import agrees.
  model::Space once;
  ASSERT_TRUE(model::ImportXSpaceBytes(bytes, &once).ok());
  EXPECT_EQ(once.warnings.back(), read.warnings.back());
  // Still refused: a truncated file.
  std::string cut = WriteFile(dir, "cut.xplane.pb", bytes.substr(0, bytes.size() - 3));
  EXPECT_FALSE(model::ReadXSpaceFile(cut, &read).ok());
}

}  // namespace
}  // namespace spyglass
