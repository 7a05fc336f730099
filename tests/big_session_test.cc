// Big sessions: the memory of collection (recorder -> model) and the
// protobuf size limit of the .xplane.pb, with a small artificial limit so
// that the test runs in seconds.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <filesystem>
#include <fstream>
#include <thread>

#include "export/xplane/xplane_writer.h"
#include "model/xspace.h"
#include "session/session.h"
#include "spyglass/annotation.h"
#include "process_memory.h"
#include "test_util.h"

using namespace spyglass;
using spyglass::testing::MakeTempDir;
using spyglass::testing::ReadXSpace;

namespace {

constexpr char kDroppedStat[] = "dropped_events_over_size_limit";

// Three host lines of `n` events each, some with stats, and a device plane.
model::Space ManyEvents(int n) {
  model::Space space;
  model::Plane& host = space.plane(model::kHostPlaneName);
  for (int t = 0; t < 3; ++t) {
    model::Line& line = host.line_with_id(100 + t);
    line.name = "thread " + std::to_string(t);
    for (int i = 0; i < n; ++i) {
      model::Event e{int64_t{i} * 1'000'000 + t, 500'000, host.intern_event(i % 2 ? "odd" : "even"), model::kNoStats};
      if (i % 10 == 0) line.add_stat(e, host.int_stat("i", i));
      line.events.push_back(e);
    }
  }
  host.stats.push_back(host.uint_stat("dropped_events", 0));
  model::Plane& gpu = space.plane("/device:GPU:0");
  model::Line& stream = gpu.line_with_id(7);
  for (int i = 0; i < n / 2; ++i) stream.events.push_back({int64_t{i} * 2'000'000, 1'000, gpu.intern_event("k"), model::kNoStats});
  space.hostnames.push_back("host-a");
  return space;
}

uint64_t StatOf(const tensorflow::profiler::XPlane& p, const std::string& name, bool* found) {
  *found = false;
  for (const auto& s : p.stats())
    if (p.stat_metadata().count(s.metadata_id()) && p.stat_metadata().at(s.metadata_id()).name() == name) {
      *found = true;
      return s.uint64_value();
    }
  return 0;
}

TEST(XSpaceSizeLimit, AnXSpaceOverTheLimitIsCutNotBroken) {
  model::Space space = ManyEvents(20000);
  std::string full;
  ASSERT_TRUE(exporter::SerializeXSpace(space, &full).ok());
  const uint64_t limit = full.size() / 3;
  std::string dir = MakeTempDir();
  std::string path = dir + "/cut.xplane.pb";
  ASSERT_TRUE(exporter::WriteXSpaceFile(space, path, {limit}).ok());

  uint64_t size = std::filesystem::file_size(path);
  EXPECT_LE(size, limit) << "the file must stay under the limit";
  EXPECT_GT(size, limit / 2) << "the cut should keep most of what fits";
  tensorflow::profiler::XSpace x = ReadXSpace(path);
  ASSERT_EQ(x.errors_size(), 0) << "the generated protobuf must parse it";
  ASSERT_EQ(x.planes_size(), 2);
  bool warned = false;
  for (const auto& w : x.warnings()) warned |= w.find("left out") != std::string::npos && w.find("limit") != std::string::npos;
  EXPECT_TRUE(warned) << "the XSpace must say that events were left out";

  // Every plane counts what it lost, and what is left is a window from the
  // start: each line keeps a prefix, all kept events before all dropped ones.
  uint64_t model_events = space.event_count(), kept = 0, dropped = 0;
  int64_t last_kept = -1;
  for (int i = 0; i < x.planes_size(); ++i) {
    const auto& p = x.planes(i);
    const model::Plane* m = space.find_plane(p.name());
    ASSERT_NE(m, nullptr);
    uint64_t plane_kept = 0;
    for (int l = 0; l < p.lines_size(); ++l) {
      const auto& events = p.lines(l).events();
      plane_kept += events.size();
      for (int k = 0; k < events.size(); ++k) {
        ASSERT_EQ(events[k].offset_ps(), m->lines[l].events[k].offset_ps);
        last_kept = std::max<int64_t>(last_kept, events[k].offset_ps());
      }
    }
    uint64_t plane_model = 0;
    for (const auto& l : m->lines) plane_model += l.events.size();
    bool found = false;
    uint64_t n = StatOf(p, kDroppedStat, &found);
    if (plane_kept < plane_model) {
      EXPECT_TRUE(found) << p.name() << " lost events and must say so";
      EXPECT_EQ(n, plane_model - plane_kept) << p.name();
    }
    kept += plane_kept;
    dropped += n;
  }
  EXPECT_GT(dropped, 0u);
  EXPECT_EQ(kept + dropped, model_events);
  for (const auto& p : space.planes)
    for (const auto& l : p.lines)
      for (size_t k = 0; k < l.events.size(); ++k)
        if (l.events[k].offset_ps > last_kept) {
          // Dropped: the file's line has fewer events than this index.
          for (const auto& xp : x.planes())
            if (xp.name() == p.name)
              for (const auto& xl : xp.lines())
                if (xl.id() == l.id) EXPECT_LE(static_cast<size_t>(xl.events_size()), k);
          break;
        }

  // Under the limit, nothing changes.
  std::string same;
  ASSERT_TRUE(exporter::SerializeXSpace(space, &same, {full.size()}).ok());
  EXPECT_EQ(same, full);
}

TEST(XSpaceSizeLimit, NoFileWhenEvenTheMetadataPassesTheLimit) {
  model::Space space = ManyEvents(100);
  std::string dir = MakeTempDir();
  std::string path = dir + "/none.xplane.pb";
  Status s = exporter::WriteXSpaceFile(space, path, {200});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("limit"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(path)) << "no broken or empty file";
}

using spyglass::testing::ResetPeak;
using spyglass::testing::StatusKb;

// Collection used to hold the recorder's chunks and the whole model at once
// (2x the recorded bytes, 3.3x with an argument per event: 113 model bytes
// for 48 recorded); each chunk now goes back as it is converted, and an
// event with one argument takes 48 bytes in the model.
TEST(BigSession, StopHoldsTheRecordsOrTheModelNotBoth) {
  if (!ResetPeak()) GTEST_SKIP() << "cannot reset VmHWM (/proc/self/clear_refs)";
  constexpr uint64_t kPerThread = 5'000'000;  // 120 MB at 24 B/event, 240 MB with an argument
  profiler::ProfileOptions options;
  options.buffer_bytes_per_thread = 256ull << 20;
  options.buffer_bytes_total = 1ull << 30;
  int64_t base_kb = StatusKb("VmRSS");
  std::unique_ptr<session::Session> s;
  ASSERT_TRUE(session::Session::Create(options, "busy", &s).ok());
  auto record = [] {
    for (uint64_t i = 0; i < kPerThread; ++i) profiler::TraceAnnotation a("e");
  };
  std::thread exits_before_stop([] {
    for (uint64_t i = 0; i < kPerThread; ++i) profiler::TraceAnnotation a("a", {{"i", static_cast<int64_t>(i)}});
  });
  exits_before_stop.join();
  bool release = false;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> recorded{false};
  std::thread lives_on([&] {
    record();
    recorded = true;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });
  });
  for (int i = 0; i < 6000 && !recorded; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(recorded);
  int64_t recorded_kb = StatusKb("VmRSS") - base_kb;
  ASSERT_TRUE(ResetPeak());
  model::Space space;
  session::SessionSummary summary;
  ASSERT_TRUE(s->Stop(&space, &summary).ok());
  int64_t peak_kb = StatusKb("VmHWM") - base_kb;
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  lives_on.join();
  std::printf("recorded %lld MiB, peak while stopping %lld MiB\n", static_cast<long long>(recorded_kb / 1024),
              static_cast<long long>(peak_kb / 1024));
  EXPECT_EQ(summary.events, 2 * kPerThread);
  EXPECT_EQ(summary.dropped_events, 0u);
  EXPECT_GT(recorded_kb, 300 * 1024);
  // The arguments made it: the last event of the thread that had them.
  const model::Plane* host = space.find_plane(model::kHostPlaneName);
  ASSERT_NE(host, nullptr);
  bool found = false;
  for (const model::Line& l : host->lines)
    if (l.events.size() == kPerThread && !l.stats_of(l.events.back()).empty()) {
      found = true;
      EXPECT_EQ(host->stat_text(l.stats_of(l.events.back())[0]), std::to_string(kPerThread - 1));
    }
  EXPECT_TRUE(found);
  // The pool keeps up to 64 MiB of freed chunks for the next session.
  EXPECT_LT(peak_kb, recorded_kb * 12 / 10 + 70 * 1024)
      << "recorded " << recorded_kb / 1024 << " MiB, peak while stopping " << peak_kb / 1024 << " MiB";
}

// An argument added after a child event got its own stats: the parent's
// list moves to the end of the line's pool, in order.
TEST(ModelStats, AppendsToAnEarlierEventKeepOrder) {
  model::Plane plane;
  model::Line& line = plane.line_with_id(1);
  line.events.resize(2);
  model::Event& parent = line.events[0];
  model::Event& child = line.events[1];
  line.add_stat(parent, plane.int_stat("a", 1));
  line.add_stat(child, plane.str_stat("s", "text"));
  line.add_stat(parent, plane.int_stat("b", 2));
  line.add_stat(parent, plane.int_stat("c", 3));
  std::vector<std::string> got;
  for (const model::Stat& s : line.stats_of(parent)) got.push_back(plane.stat_name(s) + "=" + plane.stat_text(s));
  EXPECT_EQ(got, (std::vector<std::string>{"a=1", "b=2", "c=3"}));
  ASSERT_EQ(line.stats_of(child).size(), 1u);
  EXPECT_EQ(plane.stat_str(line.stats_of(child)[0]), "text");
  EXPECT_TRUE(line.stats_of(model::Event{}).empty());
}

}  // namespace
