// spyglass view: the index's window queries on a run with known events,
// and the server's guards (token, Host, loopback, hostile requests).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "export/xplane/xplane_writer.h"
#include "model/schema.h"
#include "model/xspace.h"
#include "report/cpu_samples.h"
#include "report/timeline.h"
#include "sampling/cpu_model.h"
#include "spyglass/profile_reader.h"
#include "view/http_server.h"
#include "view/view_app.h"
#include "view/view_index.h"

namespace spyglass::view {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kMsNs = 1'000'000;

struct Span {
  int64_t start, end;
  std::string name;
  uint64_t count;
};

uint64_t Varint(const std::string& b, size_t* p) {
  uint64_t v = 0;
  for (int shift = 0; *p < b.size(); shift += 7) {
    uint8_t c = static_cast<uint8_t>(b[(*p)++]);
    v |= uint64_t{c & 127u} << shift;
    if (!(c & 128)) break;
  }
  return v;
}

// One lane of a window, decoded as the page does.
std::vector<Span> Decode(const report::Timeline& w, const report::Timeline& full, size_t track, size_t lane) {
  const report::TimelineLevel& l = w.tracks[track].lanes[lane].at(0);
  size_t p = l.offset;
  int64_t prev = w.tracks[track].at_ns;
  std::vector<Span> out;
  for (uint64_t i = 0; i < l.spans; i++) {
    uint64_t z = Varint(w.blob, &p);
    int64_t start = prev + (static_cast<int64_t>(z >> 1) ^ -static_cast<int64_t>(z & 1));
    int64_t end = start + static_cast<int64_t>(Varint(w.blob, &p));
    uint64_t name = Varint(w.blob, &p);
    Varint(w.blob, &p);
    uint64_t count = l.threshold_ns > 0 ? Varint(w.blob, &p) : 1;
    out.push_back({start, end, full.names.at(name), count});
    prev = end;
  }
  EXPECT_EQ(p, l.offset + l.bytes);
  return out;
}

std::string KnownRun(const std::string& dir, const char* extra = nullptr, const char* n = nullptr) {
  const char* maker = std::getenv("MAKE_KNOWN_RUN");
  if (!maker) return "";
  fs::remove_all(dir);
  std::string cmd = std::string(maker) + " " + dir + (extra ? std::string(" ") + extra + " " + n : "") + " > /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir + "/plugins/profile/run1/known.xplane.pb";
}

size_t TrackNamed(const report::Timeline& tl, const std::string& name) {
  for (size_t i = 0; i < tl.tracks.size(); i++)
    if (tl.tracks[i].name == name) return i;
  ADD_FAILURE() << "no track " << name;
  return 0;
}

TEST(ViewIndexTest, WindowGivesTheEventsOfAKnownRun) {
  std::string file = KnownRun(testing::TempDir() + "/view_known");
  if (file.empty()) GTEST_SKIP() << "MAKE_KNOWN_RUN not set";
  ViewIndex index;
  BuildProgress progress;
  ASSERT_TRUE(index.Build({file}, &progress).ok());
  // Its lines are sorted: one pass, to the end of the file.
  EXPECT_EQ(progress.pass.load(), 1u);
  EXPECT_EQ(progress.read.load(), fs::file_size(file));
  EXPECT_EQ(progress.size.load(), fs::file_size(file));
  const report::Timeline& tl = index.timeline();
  size_t main = TrackNamed(tl, "main");
  // Step 3 runs from 32 ms for 30 ms; steps 2 and 4 end 1 ms before and start 1 ms after.
  report::Timeline w = index.Window(32 * kMsNs, 62 * kMsNs, 10000);
  std::vector<Span> steps = Decode(w, tl, main, 0);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].name, "train");
  EXPECT_EQ(steps[0].start, 32 * kMsNs);
  EXPECT_EQ(steps[0].end, 62 * kMsNs);
  EXPECT_EQ(steps[0].count, 1u);
  std::vector<Span> inner = Decode(w, tl, main, 1);
  ASSERT_EQ(inner.size(), 2u);
  EXPECT_EQ(inner[0].name, "forward");
  EXPECT_EQ(inner[0].end - inner[0].start, 12 * kMsNs);
  EXPECT_EQ(inner[1].name, "backward");
  EXPECT_EQ(inner[1].start, 44 * kMsNs);
  // The whole run: all five steps, in order.
  report::Timeline all = index.Window(0, tl.duration_ns, 1000);
  std::vector<Span> five = Decode(all, tl, main, 0);
  ASSERT_EQ(five.size(), 5u);
  for (int i = 0; i < 5; i++) EXPECT_EQ(five[i].end - five[i].start, (i + 1) * 10 * kMsNs);
  // A window with nothing in it (between steps 3 and 4).
  report::Timeline gap = index.Window(62 * kMsNs + 1, 63 * kMsNs - 1, 100);
  EXPECT_TRUE(Decode(gap, tl, main, 0).empty());
}

// The streamed index (lines placed as their events come, levels written in
// chunks to the mapped file) holds the same timeline as the report's
// builder holding every line: tracks, lanes, levels and their bytes, flows.
// A line out of order (held, then placed), one deeper than kMaxLanes, one
// with events of one start (the longest first) and hostile times.
TEST(ViewIndexTest, StreamedIndexEqualsTheReportsTimeline) {
  namespace model = spyglass::model;
  model::Space space;
  space.plane(model::kHostPlaneName);
  space.plane(std::string(model::kGpuPlanePrefix) + "0");
  model::Plane& host = space.planes[0];
  model::Plane& gpu = space.planes[1];
  for (int64_t id = 1; id <= 4; id++) host.line_with_id(id).name = "t" + std::to_string(id);
  gpu.line_with_id(7).name = "Stream #7";
  constexpr int64_t kUs = 1'000'000;  // ps
  auto add = [](model::Line& line, model::Plane& plane, const std::string& name, int64_t at, int64_t dur) {
    line.events.push_back({at, dur, plane.intern_event(name)});
    return line.events.size() - 1;
  };
  // t1: 40k events, irregular, nested three deep, in order, with launches.
  uint64_t x = 88172645463325252ull;
  int64_t at = 0;
  for (int i = 0; i < 10000; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int64_t d = 100'000 + static_cast<int64_t>(x % 50'000) * 1000;
    add(host.lines[0], host, "op_" + std::to_string(x % 37), at, d);
    add(host.lines[0], host, "child", at, d / 2);
    add(host.lines[0], host, "child", at, d / 4);  // same start: the longest first
    size_t launch = add(host.lines[0], host, "launch", at + d / 2, d / 8);
    if (i % 100 == 0) {
      host.lines[0].add_stats(host.lines[0].events[launch],
                              std::vector<model::Stat>{host.uint_stat(model::kCorrelationIdStat, 1000 + i)});
      size_t k = add(gpu.lines[0], gpu, "kernel", at + d, d);
      gpu.lines[0].add_stats(gpu.lines[0].events[k],
                             std::vector<model::Stat>{gpu.uint_stat(model::kCorrelationIdStat, 1000 + i)});
    }
    at += d + static_cast<int64_t>((x >> 40) % 20'000) * 1000;
  }
  // t2: the same spans backwards (held, sorted, placed).
  for (auto it = host.lines[0].events.rbegin(); it != host.lines[0].events.rend(); ++it)
    add(host.lines[1], host, "back", it->offset_ps, it->duration_ps);
  // t3: 200 nested events: past kMaxLanes.
  for (int i = 0; i < 200; i++) add(host.lines[2], host, "deep", i * kUs, (400 - 2 * i) * kUs);
  // t4: hostile times (far apart, huge durations, negative).
  add(host.lines[3], host, "neg", -5 * kUs, kUs);
  add(host.lines[3], host, "huge", 0, INT64_MAX / 2);
  add(host.lines[3], host, "far", INT64_MAX / 4, 3);
  const std::string dir = testing::TempDir() + "/view_streamed";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string file = dir + "/host.xplane.pb";
  ASSERT_TRUE(spyglass::exporter::WriteXSpaceFile(space, file).ok());

  report::TimelineBuilder builder;
  ASSERT_TRUE(report::AddProfileFile(file, "", &builder).ok());
  report::Timeline want = builder.Finish();
  ViewIndex index;
  BuildProgress progress;
  ASSERT_TRUE(index.Build({file}, &progress).ok());
  // t2 is out of order: taken as sorted at first, the file is read again.
  EXPECT_EQ(progress.pass.load(), 2u);
  EXPECT_EQ(progress.size.load(), fs::file_size(file));
  const report::Timeline& got = index.timeline();
  EXPECT_EQ(got.events, want.events);
  EXPECT_EQ(got.start_ns, want.start_ns);
  EXPECT_EQ(got.duration_ns, want.duration_ns);
  EXPECT_EQ(got.names, want.names);
  EXPECT_EQ(got.name_events, want.name_events);
  ASSERT_EQ(got.tracks.size(), want.tracks.size());
  size_t levels = 0;
  for (size_t t = 0; t < want.tracks.size(); t++) {
    const report::TimelineTrack &g = got.tracks[t], &w = want.tracks[t];
    SCOPED_TRACE(w.name);
    EXPECT_EQ(g.name, w.name);
    EXPECT_EQ(g.at_ns, w.at_ns);
    EXPECT_EQ(g.events, w.events);
    EXPECT_EQ(g.hidden, w.hidden);
    ASSERT_EQ(g.lanes.size(), w.lanes.size());
    for (size_t l = 0; l < w.lanes.size(); l++) {
      ASSERT_EQ(g.lanes[l].size(), w.lanes[l].size()) << "lane " << l;
      for (size_t k = 0; k < w.lanes[l].size(); k++, levels++) {
        EXPECT_EQ(g.lanes[l][k].threshold_ns, w.lanes[l][k].threshold_ns);
        EXPECT_EQ(g.lanes[l][k].spans, w.lanes[l][k].spans);
        EXPECT_EQ(g.lanes[l][k].bytes, w.lanes[l][k].bytes);
        EXPECT_TRUE(w.lanes[l][k].chunks.empty());
        EXPECT_EQ(g.lanes[l][k].chunks.empty(), g.lanes[l][k].spans == 0);
      }
    }
  }
  EXPECT_GT(levels, 10u);
  EXPECT_EQ(want.tracks[TrackNamed(want, "t3")].hidden, 200 - report::kMaxLanes);
  ASSERT_EQ(got.flows.size(), want.flows.size());
  EXPECT_EQ(want.flows.size(), 100u);
  for (size_t i = 0; i < want.flows.size(); i++) {
    EXPECT_EQ(got.flows[i].from_track, want.flows[i].from_track);
    EXPECT_EQ(got.flows[i].from_ns, want.flows[i].from_ns);
    EXPECT_EQ(got.flows[i].to_lane, want.flows[i].to_lane);
    EXPECT_EQ(got.flows[i].to_ns, want.flows[i].to_ns);
  }
  // Every level's spans, read back from the file, are the builder's.
  size_t compared = 0;
  for (size_t t = 0; t < want.tracks.size(); t++)
    for (size_t l = 0; l < want.tracks[t].lanes.size(); l++)
      for (const report::TimelineLevel& wl : want.tracks[t].lanes[l]) {
        // A window as wide as the run, at the pixels that pick this level.
        int px = static_cast<int>(std::clamp<int64_t>(
            wl.threshold_ns == 0 ? kMaxWindowPixels : want.duration_ns / wl.threshold_ns, 1, kMaxWindowPixels));
        report::Timeline w = index.Window(0, want.duration_ns, px);
        const report::TimelineLevel& cut = w.tracks[t].lanes[l].at(0);
        if (cut.threshold_ns != wl.threshold_ns) continue;  // past the widest window's pixels
        ASSERT_EQ(cut.spans, wl.spans) << want.tracks[t].name << " lane " << l << " at " << wl.threshold_ns;
        EXPECT_EQ(w.blob.substr(cut.offset, cut.bytes), want.blob.substr(wl.offset, wl.bytes));
        compared++;
      }
  EXPECT_GE(compared, 8u);
}

// A level is made only once it first differs from the one below: a lane of
// 300k events 1.5 us apart (no level up to 256 ns merges them), then 700k
// of 5 ns 10 ns apart (the 16 ns level merges them into one span, past the
// first megabyte of the events' level, so that level is read back from the
// index file to make it). The levels kept are the report builder's, byte
// for byte, and the index file holds nothing else (before, every level
// made was written, kept or not).
TEST(ViewIndexTest, LevelsAreMadeOnlyOnceTheyDifferFromTheOneBelow) {
  namespace model = spyglass::model;
  model::Space space;
  space.plane(model::kHostPlaneName);
  model::Plane& host = space.planes[0];
  model::Line& line = host.line_with_id(1);
  line.name = "late";
  const uint32_t e = host.intern_event("e");
  int64_t at = 0;  // ps
  for (int i = 0; i < 300'000; i++, at += 1'500'000) line.events.push_back({at, 1'000'000, e});
  for (int i = 0; i < 700'000; i++, at += 10'000) line.events.push_back({at, 5'000, e});
  const std::string dir = testing::TempDir() + "/view_late_level";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string file = dir + "/host.xplane.pb";
  ASSERT_TRUE(spyglass::exporter::WriteXSpaceFile(space, file).ok());
  report::TimelineBuilder builder;
  ASSERT_TRUE(report::AddProfileFile(file, "", &builder).ok());
  const report::Timeline want = builder.Finish();
  ViewIndex index;
  ASSERT_TRUE(index.Build({file}).ok());
  const report::Timeline& got = index.timeline();
  ASSERT_EQ(want.tracks.size(), 1u);
  ASSERT_EQ(got.tracks.size(), 1u);
  ASSERT_EQ(want.tracks[0].lanes.size(), 1u);
  const std::vector<report::TimelineLevel>& wl = want.tracks[0].lanes[0];
  const std::vector<report::TimelineLevel>& gl = got.tracks[0].lanes[0];
  ASSERT_EQ(gl.size(), wl.size());
  ASSERT_GE(wl.size(), 3u);
  EXPECT_EQ(wl[1].threshold_ns, 16);
  EXPECT_EQ(wl[1].spans, 300'001u);  // the late merge: kept
  uint64_t kept_bytes = 0;
  for (size_t k = 0; k < wl.size(); k++) {
    SCOPED_TRACE(k);
    ASSERT_EQ(gl[k].threshold_ns, wl[k].threshold_ns);
    ASSERT_EQ(gl[k].spans, wl[k].spans);
    ASSERT_EQ(gl[k].bytes, wl[k].bytes);
    kept_bytes += gl[k].bytes;
    std::string bytes;
    for (const report::TimelineChunk& c : gl[k].chunks) {
      ASSERT_LE(c.offset + c.bytes, index.index_bytes());
      bytes += index.ChunkBytes(c);
    }
    EXPECT_EQ(bytes, want.blob.substr(wl[k].offset, wl[k].bytes));
  }
  EXPECT_GT(wl[0].bytes, uint64_t{1} << 20);
  EXPECT_EQ(index.index_bytes(), kept_bytes);
}

// An async pair (XProf's producer "_p"/"_pt" and consumer "_c"/"_ct", as
// tf.data's prefetch) across two threads is an arrow on the timeline, in the
// report's builder and in view's index; one event both consumes and
// produces (a chain); a consumer of another type is not linked.
// The CPU sampler's samples (sampling/cpu_model.h: each sample an event
// whose metadata is its innermost stack node, "cpu_stack#<n>", its function
// the node's display name) are named after their functions, as the report
// names them, not after their stack nodes.
TEST(ViewIndexTest, CpuSamplesAreNamedAfterTheirFunctionsAsInTheReport) {
  namespace model = spyglass::model;
  namespace smp = spyglass::sampling;
  model::Space space;
  model::Plane& host = space.plane(model::kHostPlaneName);
  host.stats.push_back(host.uint_stat(smp::kCpuSamplePeriodStat, 1'000'000));
  int next = 0;
  auto node = [&](uint32_t parent, const char* fn) {
    uint32_t id = host.intern_event(std::string(smp::kCpuStackNodePrefix) + std::to_string(next++));
    std::vector<model::Stat> st{host.ref_stat(smp::kCpuFrameStat, fn)};
    if (parent) st.push_back(host.uint_stat(smp::kCpuParentStat, parent));
    st.push_back(host.ref_stat(smp::kCpuFrameKindStat, "native"));
    host.event_metadata_at(id).display_name = fn;
    host.event_metadata_at(id).stats = std::move(st);
    return id;
  };
  const uint32_t main_fn = node(0, "main"), a = node(main_fn, "burn_a"), b = node(main_fn, "burn_b");
  constexpr int64_t kMsPs = 1'000'000'000;
  model::Line& thread = host.line_with_id(7);
  thread.name = "main";
  thread.events.push_back({0, 10 * kMsPs, host.intern_event("train")});
  model::Line& samples = host.line_with_id(smp::kCpuSampleLineIdBase + 7);
  samples.name = std::string(smp::kCpuSamplesLineName);
  samples.display_name = "main 7 CPU samples";
  for (auto [ms, leaf] : std::vector<std::pair<int64_t, uint32_t>>{{1, a}, {2, a}, {3, b}, {5, main_fn}})
    samples.events.push_back({ms * kMsPs, kMsPs, leaf});
  const std::string dir = testing::TempDir() + "/view_cpu_samples";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string file = dir + "/host.xplane.pb";
  ASSERT_TRUE(spyglass::exporter::WriteXSpaceFile(space, file).ok());

  ViewIndex index;
  ASSERT_TRUE(index.Build({file}).ok());
  const report::Timeline& tl = index.timeline();
  for (const std::string& name : tl.names) EXPECT_FALSE(name.starts_with(smp::kCpuStackNodePrefix)) << name;
  const size_t track = TrackNamed(tl, "main 7 CPU samples");
  report::Timeline w = index.Window(0, 10 * kMsNs, 10000);
  std::vector<Span> got = Decode(w, tl, track, 0);
  ASSERT_EQ(got.size(), 4u);
  const char* want[] = {"burn_a", "burn_a", "burn_b", "main"};
  for (size_t i = 0; i < got.size(); i++) EXPECT_EQ(got[i].name, want[i]) << i;
  EXPECT_EQ(got[2].start, 3 * kMsNs);
  EXPECT_EQ(got[2].end, 4 * kMsNs);
  // The report's timeline (the samples counted, then added with their stacks) has the same names.
  report::TimelineBuilder builder;
  uint64_t sample_lines = 0;
  ASSERT_TRUE(report::AddProfileFile(file, "", &builder, &sample_lines).ok());
  EXPECT_EQ(sample_lines, 1u);
  std::vector<report::CpuSampleSet> sets;
  ASSERT_TRUE(report::AddCpuSamples(file, "", &builder, &sets).ok());
  report::Timeline report_tl = builder.Finish();
  std::vector<std::string> report_names(report_tl.names), view_names(tl.names);
  std::sort(report_names.begin(), report_names.end());
  std::sort(view_names.begin(), view_names.end());
  EXPECT_EQ(view_names, report_names);
}

TEST(ViewIndexTest, AsyncPairsAreFlows) {
  namespace model = spyglass::model;
  model::Space space;
  space.plane(model::kHostPlaneName);
  model::Plane& host = space.planes[0];
  host.line_with_id(1).name = "producer";
  host.line_with_id(2).name = "consumer";
  host.line_with_id(3).name = "stage2";
  constexpr int64_t kUs = 1'000'000;  // ps
  auto add = [&](size_t line, const char* name, int64_t at, std::vector<model::Stat> stats) {
    model::Line& l = host.lines[line];
    l.events.push_back({at, 5 * kUs, host.intern_event(name)});
    l.add_stats(l.events.back(), stats);
  };
  add(0, "PrefetchProduce", 10 * kUs, {host.int_stat("_pt", 7), host.uint_stat("_p", 42)});
  add(1, "PrefetchConsume", 30 * kUs,
      {host.int_stat("_ct", 7), host.uint_stat("_c", 42), host.int_stat("_pt", 8), host.uint_stat("_p", 43)});
  add(2, "Stage2", 50 * kUs, {host.int_stat("_ct", 8), host.uint_stat("_c", 43)});
  add(2, "OtherType", 70 * kUs, {host.int_stat("_ct", 9), host.uint_stat("_c", 42)});
  const std::string dir = testing::TempDir() + "/view_async";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string file = dir + "/host.xplane.pb";
  ASSERT_TRUE(spyglass::exporter::WriteXSpaceFile(space, file).ok());
  report::TimelineBuilder builder;
  ASSERT_TRUE(report::AddProfileFile(file, "", &builder).ok());
  report::Timeline want = builder.Finish();
  ViewIndex index;
  ASSERT_TRUE(index.Build({file}).ok());
  for (const report::Timeline* tl : {static_cast<const report::Timeline*>(&want), &index.timeline()}) {
    ASSERT_EQ(tl->flows.size(), 2u);
    const size_t p = TrackNamed(*tl, "producer"), c = TrackNamed(*tl, "consumer"), s2 = TrackNamed(*tl, "stage2");
    const int64_t at0 = 10'000;  // ns: the run starts at the producer
    EXPECT_EQ(tl->flows[0].from_track, p);
    EXPECT_EQ(tl->flows[0].from_ns, 10'000 - at0);
    EXPECT_EQ(tl->flows[0].to_track, c);
    EXPECT_EQ(tl->flows[0].to_ns, 30'000 - at0);
    EXPECT_EQ(tl->flows[1].from_track, c);
    EXPECT_EQ(tl->flows[1].from_ns, 30'000 - at0);
    EXPECT_EQ(tl->flows[1].to_track, s2);
    EXPECT_EQ(tl->flows[1].to_ns, 50'000 - at0);
  }
}

// KiB of `path` resident in this process (its mappings in /proc/self/smaps).
uint64_t ResidentKiBOf(const std::string& path) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false;
  uint64_t kib = 0;
  while (std::getline(smaps, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') < line.find(' '))
      in = line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
    else if (in && line.rfind("Rss:", 0) == 0)
      kib += std::stoull(line.substr(4));
  }
  return kib;
}

// One thread of 2M events (a line of ~30 MB): the scan gives back the pages
// it has read within the line, not only between lines, so a line of
// gigabytes (spyglass view of 100M events) is never resident whole.
TEST(ViewIndexTest, ScanOfOneBigLineKeepsLittleOfTheFileResident) {
  namespace model = spyglass::model;
  const std::string dir = testing::TempDir() + "/view_one_line";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string file = fs::canonical(dir).string() + "/host.xplane.pb";
  {
    model::Space space;
    space.plane(model::kHostPlaneName);
    model::Plane& host = space.planes[0];
    host.line_with_id(1).name = "busy";
    model::Line& line = host.lines[0];
    const uint32_t name = host.intern_event("op");
    line.events.reserve(2'000'000);
    for (int64_t i = 0; i < 2'000'000; i++) line.events.push_back({i * 3'000'000, 2'000'000, name});
    ASSERT_TRUE(spyglass::exporter::WriteXSpaceFile(space, file).ok());
  }
  const uint64_t file_kib = fs::file_size(file) >> 10;
  ASSERT_GT(file_kib, 24u << 10);
  struct Visitor : profile::ProfileVisitor {
    std::string path;
    uint64_t events = 0, most_kib = 0;
    void OnEvent(const profile::EventRecord&) override {
      if (++events % 250'000 == 0) most_kib = std::max(most_kib, ResidentKiBOf(path));
    }
    bool OnLine(const profile::LineHeader&) override {
      most_kib = std::max(most_kib, ResidentKiBOf(path));
      return true;
    }
    void OnLineEnd() override { most_kib = std::max(most_kib, ResidentKiBOf(path)); }
  } visitor;
  visitor.path = file;
  profile::ProfileReader reader;
  ASSERT_TRUE(reader.Open(file).ok());
  ASSERT_TRUE(reader.Scan(visitor).ok());
  EXPECT_EQ(visitor.events, 2'000'000u);
  // The release step (16 MiB) and the page in hand, not the line.
  EXPECT_LE(visitor.most_kib, (16u << 10) + 64) << "of a file of " << file_kib << " KiB";
}

TEST(ViewIndexTest, ZoomedInGivesSingleEventsAnywhereInABigLane) {
  // 300k events on "busy": outer (4 us) holding inner (2 us) holding leaf, every 4.5 us.
  std::string file = KnownRun(testing::TempDir() + "/view_busy", "--busy", "300000");
  if (file.empty()) GTEST_SKIP() << "MAKE_KNOWN_RUN not set";
  ViewIndex index;
  ASSERT_TRUE(index.Build({file}).ok());
  const report::Timeline& tl = index.timeline();
  size_t busy = TrackNamed(tl, "busy");
  // Zoomed out: coarsened to at most about two spans per pixel.
  report::Timeline out = index.Window(0, tl.duration_ns, 500);
  std::vector<Span> coarse = Decode(out, tl, busy, 0);
  EXPECT_LE(coarse.size(), 1000u);
  uint64_t merged = 0;
  for (const Span& s : coarse) merged += s.count;
  EXPECT_EQ(merged, 100000u);  // every event of the lane is in some span
  // Zoomed in far from the start: exactly the outer events that overlap.
  const int64_t at = 99000 * 4500;  // ns: outer #99000
  report::Timeline in = index.Window(at, at + 9000, 1000);
  std::vector<Span> exact = Decode(in, tl, busy, 0);
  ASSERT_EQ(exact.size(), 3u);  // #99000, #99001, #99002 (starts at at + 9000)
  for (size_t i = 0; i < 3; i++) {
    EXPECT_EQ(exact[i].name, "outer");
    EXPECT_EQ(exact[i].start - tl.tracks[busy].at_ns, at + static_cast<int64_t>(i) * 4500);
    EXPECT_EQ(exact[i].end - exact[i].start, 4000);
    EXPECT_EQ(exact[i].count, 1u);
  }
}

// ---- the server -----------------------------------------------------------------

std::string Exchange(int port, const std::string& request, bool close_write = true) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "connect failed";
  }
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  if (close_write) ::shutdown(fd, SHUT_WR);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

int StatusOf(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0) return -1;
  return std::atoi(response.c_str() + 9);
}

class ServerTest : public testing::Test {
 protected:
  void SetUp() override {
    HttpOptions o;
    o.token = "0123456789abcdef0123456789abcdef";
    o.max_connections = 2;
    o.io_timeout_ms = 1500;
    ASSERT_TRUE(server_.Start(o, [](const HttpRequest& r) {
      return HttpResponse{200, "text/plain", "path=" + r.path + " x=" + (r.query.count("x") ? r.query.at("x") : "")};
    }).ok());
    host_ = "Host: 127.0.0.1:" + std::to_string(server_.port()) + "\r\n";
  }
  std::string Get(const std::string& target, const std::string& headers = "") {
    return Exchange(server_.port(), "GET " + target + " HTTP/1.1\r\n" + host_ + headers + "\r\n");
  }
  HttpServer server_;
  std::string host_;
  const std::string token_ = "token=0123456789abcdef0123456789abcdef";
};

TEST_F(ServerTest, TokenRequired) {
  std::string ok = Get("/a%20b?x=1&" + token_);
  EXPECT_EQ(StatusOf(ok), 200) << ok;
  EXPECT_NE(ok.find("path=/a b x=1"), std::string::npos) << ok;
  EXPECT_EQ(StatusOf(Get("/")), 403);
  EXPECT_EQ(StatusOf(Get("/?token=")), 403);
  EXPECT_EQ(StatusOf(Get("/?token=0123456789abcdef0123456789abcdee")), 403);
  EXPECT_EQ(StatusOf(Get("/?token=0123456789abcdef0123456789abcdef0")), 403);
  std::string denied = Get("/window?t0=0&t1=1&px=1");
  EXPECT_NE(denied.find("token is required"), std::string::npos) << denied;
  // localhost is the loopback too.
  EXPECT_EQ(StatusOf(Exchange(server_.port(), "GET /?" + token_ + " HTTP/1.1\r\nHost: localhost:" +
                                                  std::to_string(server_.port()) + "\r\n\r\n")),
            200);
}

TEST_F(ServerTest, OtherHostNamesRefused) {
  // A page of another site whose name was rebound to 127.0.0.1 sends its own name.
  std::string r = Exchange(server_.port(), "GET /?" + token_ + " HTTP/1.1\r\nHost: evil.example:" +
                                               std::to_string(server_.port()) + "\r\n\r\n");
  EXPECT_EQ(StatusOf(r), 403) << r;
  EXPECT_EQ(StatusOf(Exchange(server_.port(), "GET /?" + token_ + " HTTP/1.1\r\n\r\n")), 400);
  EXPECT_EQ(StatusOf(Get("/?" + token_, "Host: 127.0.0.1:1\r\n")), 400);  // two Host headers
}

TEST_F(ServerTest, LoopbackOnly) {
  // Every other address of this machine refuses the port.
  ifaddrs* list = nullptr;
  ASSERT_EQ(::getifaddrs(&list), 0);
  int tried = 0;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    sockaddr_in a = *reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if ((ntohl(a.sin_addr.s_addr) >> 24) == 127) continue;
    a.sin_port = htons(static_cast<uint16_t>(server_.port()));
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << "reachable on " << i->ifa_name;
    ::close(fd);
    tried++;
  }
  ::freeifaddrs(list);
  // Also by construction: the bound address.
  std::printf("tried %d non-loopback addresses\n", tried);
}

TEST_F(ServerTest, HostileRequests) {
  EXPECT_EQ(StatusOf(Exchange(server_.port(), "POST /?" + token_ + " HTTP/1.1\r\n" + host_ + "\r\n")), 405);
  EXPECT_EQ(StatusOf(Exchange(server_.port(), "garbage\r\n\r\n")), 400);
  EXPECT_EQ(StatusOf(Exchange(server_.port(), "GET /? HTTP/2\r\n\r\n")), 400);
  EXPECT_EQ(StatusOf(Exchange(server_.port(), "GET http://x/ HTTP/1.1\r\n" + host_ + "\r\n")), 400);
  EXPECT_EQ(StatusOf(Get("/?" + token_, "Content-Length: 5\r\n")), 413);
  EXPECT_EQ(StatusOf(Get("/?" + token_, "Transfer-Encoding: chunked\r\n")), 413);
  EXPECT_EQ(StatusOf(Get("/%zz?" + token_)), 400);
  EXPECT_EQ(StatusOf(Get("/%4?" + token_)), 400);
  std::string many;
  for (int i = 0; i < 100; i++) many += "X-" + std::to_string(i) + ": 1\r\n";
  EXPECT_EQ(StatusOf(Get("/?" + token_, many)), 431);
  std::string big = Get("/?" + token_ + "&x=" + std::string(20000, 'a'));
  EXPECT_EQ(StatusOf(big), 431) << big.substr(0, 200);
  EXPECT_EQ(StatusOf(Exchange(server_.port(), "GET /?" + token_ + " HTTP/1.1\r\n" + host_ + std::string("X: a\0b\r\n\r\n", 11))), 400);
  // A head that never ends: answered when too long, whatever follows.
  EXPECT_EQ(StatusOf(Exchange(server_.port(), std::string(100000, 'G'))), 431);
  // Still serving.
  EXPECT_EQ(StatusOf(Get("/?" + token_)), 200);
}

TEST_F(ServerTest, SlowAndTooManyClientsAreBounded) {
  // Two workers held by clients that send nothing, two more waiting: the next is turned away at once.
  std::vector<int> idle;
  auto open = [&] {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(server_.port()));
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    return fd;
  };
  for (int i = 0; i < 4; i++) {
    idle.push_back(open());
    ::usleep(100000);  // taken by a worker or queued before the next
  }
  std::string refused = Get("/?" + token_);
  EXPECT_EQ(StatusOf(refused), 503) << refused;
  // The idle ones are dropped with 408 after the I/O timeout.
  char buf[256];
  ssize_t n = ::recv(idle[0], buf, sizeof buf - 1, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(StatusOf(std::string(buf, static_cast<size_t>(n))), 408);
  for (int fd : idle) ::close(fd);
  ::usleep(2000000);
  EXPECT_EQ(StatusOf(Get("/?" + token_)), 200);
  EXPECT_GE(server_.refused(), 1u);
}

// Before the index is ready: a page that shows the build's progress (asked
// from the same server, with the token of its URL), /progress as JSON, and
// 503 for windows; once ready, /progress says so (the page then reloads).
TEST(ViewAppTest, ProgressIsServedWhileIndexing) {
  BuildProgress progress;
  progress.size = 3 << 20;
  progress.read = 1 << 20;
  HttpResponse page = IndexingResponse({"/", {}}, progress);
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("fetch('progress' + q"), std::string::npos);
  EXPECT_NE(page.body.find("connect-src 'self'"), std::string::npos);
  HttpResponse p = IndexingResponse({"/progress", {}}, progress);
  EXPECT_EQ(p.status, 200);
  EXPECT_EQ(p.body, R"({"events":0,"pass":1,"read":1048576,"ready":false,"size":3145728})");
  EXPECT_EQ(IndexingResponse({"/window", {{"t0", "0"}, {"t1", "1"}, {"px", "1"}}}, progress).status, 503);
  std::string file = KnownRun(testing::TempDir() + "/view_progress");
  if (file.empty()) GTEST_SKIP() << "MAKE_KNOWN_RUN not set";
  ViewIndex index;
  ASSERT_TRUE(index.Build({file}, &progress).ok());
  EXPECT_EQ(progress.read.load(), progress.size.load());
  EXPECT_EQ(progress.events.load(), index.timeline().events);
  ViewApp app(&index, "known");
  EXPECT_EQ(app.Handle({"/progress", {}}).body, R"({"ready": true})");
}


// The cache: an index kept in a private directory is mapped again (same
// timeline, same windows) while the files are unchanged; a touched or
// appended file, or a truncated or damaged cache file, is rebuilt (and said
// so); the directory is refused when it is a link, another user's or
// writable by others (the index is then temporary: nothing is written
// there); the cache stays under its bound.
struct CacheRun {
  std::vector<std::string> said;
  CacheOptions options;
  explicit CacheRun(const std::string& dir) {
    options.dir = dir;
    options.say = [this](const std::string& what) { said.push_back(what); };
  }
  bool Said(const std::string& part) const {
    for (const std::string& s : said)
      if (s.find(part) != std::string::npos) return true;
    return false;
  }
  std::string All() const {
    std::string all;
    for (const std::string& s : said) all += s + "\n";
    return all;
  }
};

std::string WindowBytes(const ViewIndex& index, int64_t t0, int64_t t1, int px) {
  report::Timeline w = index.Window(t0, t1, px);
  std::string out = w.blob;
  for (const report::TimelineTrack& t : w.tracks)
    for (const auto& levels : t.lanes)
      for (const report::TimelineLevel& l : levels) out += "|" + std::to_string(l.spans) + "," + std::to_string(l.bytes);
  for (const report::TimelineCounter& c : w.counters)
    for (const report::TimelineLevel& l : c.levels) out += "|c" + std::to_string(l.spans);
  return out;
}

std::vector<std::string> CacheFiles(const std::string& dir) {
  std::vector<std::string> names;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(ViewCacheTest, UnchangedRunReusedChangedOrDamagedRebuilt) {
  std::string file = KnownRun(testing::TempDir() + "/view_cache_run", "--counters", "5000");
  if (file.empty()) GTEST_SKIP() << "MAKE_KNOWN_RUN not set";
  const std::string root = testing::TempDir() + "/view_cache";
  fs::remove_all(root);
  const std::string dir = root + "/spyglass/view";
  ViewIndex first;
  CacheRun run1(dir);
  ASSERT_TRUE(first.Build({file}, nullptr, &run1.options).ok());
  EXPECT_FALSE(first.reused());
  EXPECT_TRUE(run1.Said("index cached in " + dir + "/index-v")) << run1.All();
  EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms::owner_all);
  EXPECT_EQ(fs::status(root + "/spyglass").permissions() & fs::perms::all, fs::perms::owner_all);
  ASSERT_EQ(CacheFiles(dir).size(), 1u);
  const std::string cached = dir + "/" + CacheFiles(dir)[0];
  const report::Timeline& tl = first.timeline();
  ASSERT_FALSE(tl.counters.empty());
  auto same_as_first = [&](const ViewIndex& again) {
    const report::Timeline& t = again.timeline();
    EXPECT_EQ(t.events, tl.events);
    EXPECT_EQ(t.names, tl.names);
    EXPECT_EQ(t.name_events, tl.name_events);
    EXPECT_EQ(t.details, tl.details);
    EXPECT_EQ(t.flows.size(), tl.flows.size());
    EXPECT_EQ(t.blob, tl.blob);
    ASSERT_EQ(t.tracks.size(), tl.tracks.size());
    for (size_t i = 0; i < t.tracks.size(); i++) {
      EXPECT_EQ(t.tracks[i].name, tl.tracks[i].name);
      EXPECT_EQ(t.tracks[i].lanes.size(), tl.tracks[i].lanes.size());
    }
    EXPECT_EQ(WindowBytes(again, 0, tl.duration_ns, 1000), WindowBytes(first, 0, tl.duration_ns, 1000));
    EXPECT_EQ(WindowBytes(again, 32 * kMsNs, 62 * kMsNs, 10000), WindowBytes(first, 32 * kMsNs, 62 * kMsNs, 10000));
    EXPECT_EQ(again.index_bytes(), first.index_bytes());
  };
  {
    ViewIndex again;
    CacheRun run2(dir);
    ASSERT_TRUE(again.Build({file}, nullptr, &run2.options).ok());
    EXPECT_TRUE(again.reused());
    EXPECT_TRUE(run2.Said("reusing the index cached in " + cached)) << run2.All();
    same_as_first(again);
  }
  // Truncated: rebuilt, said so.
  fs::resize_file(cached, fs::file_size(cached) / 2);
  {
    ViewIndex again;
    CacheRun run3(dir);
    ASSERT_TRUE(again.Build({file}, nullptr, &run3.options).ok());
    EXPECT_FALSE(again.reused());
    EXPECT_TRUE(run3.Said("the cached index " + cached + " is truncated")) << run3.All();
    same_as_first(again);
  }
  // One byte of the levels changed: its checksum finds it.
  {
    std::fstream f(cached, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char c = 0;
    f.read(&c, 1);
    f.seekp(100);
    c = static_cast<char>(c ^ 0x40);
    f.write(&c, 1);
  }
  {
    ViewIndex again;
    CacheRun run4(dir);
    ASSERT_TRUE(again.Build({file}, nullptr, &run4.options).ok());
    EXPECT_FALSE(again.reused());
    EXPECT_TRUE(run4.Said("is damaged (its levels' checksum)")) << run4.All();
    same_as_first(again);
  }
  // Touched (a new mtime): another key, rebuilt.
  {
    ViewIndex again;
    fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(5));
    CacheRun run5(dir);
    ASSERT_TRUE(again.Build({file}, nullptr, &run5.options).ok());
    EXPECT_FALSE(again.reused());
    EXPECT_TRUE(run5.Said("index cached in")) << run5.All();
    same_as_first(again);
  }
  // Appended to (an unknown field: the file still reads): rebuilt.
  {
    std::ofstream(file, std::ios::app | std::ios::binary).write("\x22\x01h", 3);  // one more hostname
    ViewIndex again;
    CacheRun run6(dir);
    ASSERT_TRUE(again.Build({file}, nullptr, &run6.options).ok());
    EXPECT_FALSE(again.reused());
    EXPECT_TRUE(run6.Said("index cached in")) << run6.All();
    same_as_first(again);
    ViewIndex third;
    CacheRun run7(dir);
    ASSERT_TRUE(third.Build({file}, nullptr, &run7.options).ok());
    EXPECT_TRUE(third.reused()) << run7.All();
  }
  // A link planted at the index's name: removed, never written through.
  {
    std::vector<std::string> names = CacheFiles(dir);
    std::string newest;
    for (const std::string& n : names)
      if (newest.empty() || fs::last_write_time(dir + "/" + n) > fs::last_write_time(dir + "/" + newest)) newest = n;
    ASSERT_TRUE(newest.starts_with("index-v"));
    const std::string target = root + "/target";
    std::ofstream(target) << "theirs";
    fs::remove(dir + "/" + newest);
    fs::create_symlink(target, dir + "/" + newest);
    ViewIndex again;
    CacheRun run8(dir);
    ASSERT_TRUE(again.Build({file}, nullptr, &run8.options).ok());
    EXPECT_FALSE(again.reused());
    EXPECT_TRUE(run8.Said("rebuilding it")) << run8.All();
    std::ifstream in(target);
    std::string theirs((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(theirs, "theirs");
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir + "/" + newest)));
  }
  fs::remove_all(root);
  fs::remove_all(testing::TempDir() + "/view_cache_run");
}

TEST(ViewCacheTest, UnsafeDirectoriesRefused) {
  std::string file = KnownRun(testing::TempDir() + "/view_cache_refused");
  if (file.empty()) GTEST_SKIP() << "MAKE_KNOWN_RUN not set";
  const std::string root = testing::TempDir() + "/view_cache_refused_dirs";
  fs::remove_all(root);
  fs::create_directories(root + "/elsewhere");
  auto refused = [&](const std::string& dir, const std::string& why) {
    ViewIndex index;
    CacheRun run(dir);
    ASSERT_TRUE(index.Build({file}, nullptr, &run.options).ok());
    EXPECT_FALSE(index.reused());
    EXPECT_TRUE(run.Said("not using the index cache: ")) << run.All();
    EXPECT_TRUE(run.Said(why)) << run.All();
    EXPECT_GT(index.timeline().events, 0u);
    EXPECT_TRUE(fs::is_empty(root + "/elsewhere"));
  };
  // A link at the cache directory, and at the one above it.
  fs::create_directories(root + "/a/spyglass");
  fs::create_directory_symlink(root + "/elsewhere", root + "/a/spyglass/view");
  refused(root + "/a/spyglass/view", "symbolic link");
  fs::create_directories(root + "/b");
  fs::create_directory_symlink(root + "/elsewhere", root + "/b/spyglass");
  refused(root + "/b/spyglass/view", "symbolic link");
  // Writable by group or others.
  fs::create_directories(root + "/c/spyglass/view");
  fs::permissions(root + "/c/spyglass/view", fs::perms::all);
  refused(root + "/c/spyglass/view", "writable by group or others");
  fs::create_directories(root + "/d/spyglass/view");
  fs::permissions(root + "/d/spyglass", fs::perms::owner_all | fs::perms::group_all);
  refused(root + "/d/spyglass/view", "writable by group or others");
  EXPECT_TRUE(fs::is_empty(root + "/c/spyglass/view"));
  // Another user's (only root can make one).
  if (geteuid() == 0) {
    fs::create_directories(root + "/e/spyglass/view");
    fs::permissions(root + "/e/spyglass", fs::perms::owner_all);
    fs::permissions(root + "/e/spyglass/view", fs::perms::owner_all);
    ASSERT_EQ(::chown((root + "/e/spyglass/view").c_str(), 65534, 65534), 0);
    refused(root + "/e/spyglass/view", "another user's");
    EXPECT_TRUE(fs::is_empty(root + "/e/spyglass/view"));
  }
  fs::remove_all(root);
  fs::remove_all(testing::TempDir() + "/view_cache_refused");
}

TEST(ViewCacheTest, BoundedLeastRecentlyUsedFirst) {
  std::string a = KnownRun(testing::TempDir() + "/view_cache_a", "--busy", "20000");
  if (a.empty()) GTEST_SKIP() << "MAKE_KNOWN_RUN not set";
  std::string b = KnownRun(testing::TempDir() + "/view_cache_b", "--busy", "30000");
  const std::string root = testing::TempDir() + "/view_cache_bound";
  fs::remove_all(root);
  fs::create_directories(root);
  auto disk_bytes = [](const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return static_cast<uint64_t>(st.st_blocks) * 512;
  };
  // Each alone, for their sizes.
  uint64_t size_a = 0, size_b = 0;
  for (auto [file, size] : {std::pair{a, &size_a}, std::pair{b, &size_b}}) {
    const std::string dir = root + "/alone" + std::to_string(size == &size_a) + "/spyglass/view";
    ViewIndex index;
    CacheRun run(dir);
    ASSERT_TRUE(index.Build({file}, nullptr, &run.options).ok());
    for (const std::string& n : CacheFiles(dir)) *size += disk_bytes(dir + "/" + n);
  }
  ASSERT_GT(std::min(size_a, size_b), 65536u);
  const std::string dir = root + "/spyglass/view";
  // Too small for any: not kept.
  {
    ViewIndex index;
    CacheRun run(dir);
    run.options.max_bytes = 1;
    ASSERT_TRUE(index.Build({a}, nullptr, &run.options).ok());
    EXPECT_TRUE(run.Said("larger than the cache's bound")) << run.All();
    EXPECT_TRUE(CacheFiles(dir).empty());
  }
  // Room for one: the second evicts the first.
  const uint64_t room = std::max(size_a, size_b) + std::min(size_a, size_b) / 2;
  {
    ViewIndex index;
    CacheRun run(dir);
    run.options.max_bytes = room;
    ASSERT_TRUE(index.Build({a}, nullptr, &run.options).ok());
    ASSERT_EQ(CacheFiles(dir).size(), 1u) << run.All();
  }
  const std::string first = CacheFiles(dir)[0];
  // Temporary files: one of a writer that is gone (removed), one of a
  // writer still running (this one: kept).
  pid_t gone = fork();
  if (gone == 0) _exit(0);
  ASSERT_GT(gone, 0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  const std::string dead = ".spyglass-" + std::to_string(gone) + "-0.tmp";
  const std::string live = ".spyglass-" + std::to_string(getpid()) + "-999.tmp";
  std::ofstream(dir + "/" + dead) << "partial";
  std::ofstream(dir + "/" + live) << "partial";
  {
    ViewIndex index;
    CacheRun run(dir);
    run.options.max_bytes = room;
    ASSERT_TRUE(index.Build({b}, nullptr, &run.options).ok());
    EXPECT_TRUE(run.Said("evicted " + dir + "/" + first)) << run.All();
    EXPECT_FALSE(fs::exists(dir + "/" + dead));
    EXPECT_TRUE(fs::exists(dir + "/" + live));
    fs::remove(dir + "/" + live);
    ASSERT_EQ(CacheFiles(dir).size(), 1u) << run.All();
    EXPECT_NE(CacheFiles(dir)[0], first);
  }
  fs::remove_all(root);
  fs::remove_all(testing::TempDir() + "/view_cache_a");
  fs::remove_all(testing::TempDir() + "/view_cache_b");
}

// The build's progress moves within a line: a trace of one busy thread is
// one line of most of the file (before, progress came only at line starts:
// nothing between the start and the end of such a file).
TEST(ViewAppTest, ProgressMovesWithinALine) {
  namespace model = spyglass::model;
  const std::string dir = testing::TempDir() + "/view_progress_line";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string file = dir + "/host.xplane.pb";
  {
    model::Space space;
    space.plane(model::kHostPlaneName);
    model::Plane& host = space.planes[0];
    host.line_with_id(1).name = "busy";
    model::Line& line = host.lines[0];
    const uint32_t name = host.intern_event("op");
    line.events.reserve(2'000'000);
    for (int64_t i = 0; i < 2'000'000; i++) line.events.push_back({i * 3'000'000, 2'000'000, name});
    ASSERT_TRUE(spyglass::exporter::WriteXSpaceFile(space, file).ok());
  }
  const uint64_t size = fs::file_size(file);
  ASSERT_GT(size, uint64_t{20} << 20);
  std::vector<uint64_t> done;
  report::TimelineBuilder builder;
  ASSERT_TRUE(report::AddProfileFile(file, "", &builder, nullptr, nullptr,
                                     [&](uint64_t at, uint64_t all) {
                                       EXPECT_EQ(all, size);
                                       done.push_back(at);
                                     })
                  .ok());
  ASSERT_FALSE(done.empty());
  EXPECT_EQ(done.back(), size);
  EXPECT_TRUE(std::is_sorted(done.begin(), done.end()));
  EXPECT_TRUE(std::any_of(done.begin(), done.end(), [&](uint64_t at) { return at >= (uint64_t{16} << 20) && at < size; }))
      << done.size() << " calls";
  fs::remove_all(dir);
}

TEST(ViewAppTest, PageAndWindowRoutes) {
  std::string file = KnownRun(testing::TempDir() + "/view_app");
  if (file.empty()) GTEST_SKIP() << "MAKE_KNOWN_RUN not set";
  ViewIndex index;
  ASSERT_TRUE(index.Build({file}).ok());
  ViewApp app(&index, "known");
  HttpResponse page = app.Handle({"/", {}});
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("connect-src 'self'"), std::string::npos);
  EXPECT_NE(page.body.find("report.onView"), std::string::npos);  // view.js is in
  HttpResponse w = app.Handle({"/window", {{"t0", "0"}, {"t1", "1000000000"}, {"px", "800"}}});
  ASSERT_EQ(w.status, 200);
  ASSERT_GE(w.body.size(), 4u);
  uint32_t n = 0;
  for (int i = 0; i < 4; i++) n |= uint32_t{static_cast<uint8_t>(w.body[i])} << (8 * i);
  ASSERT_LE(4 + n, w.body.size());
  EXPECT_EQ(w.body.substr(4, 10), "{\"counters");
  for (auto q : std::vector<std::map<std::string, std::string>>{
           {}, {{"t0", "x"}, {"t1", "1"}, {"px", "1"}}, {{"t0", "5"}, {"t1", "1"}, {"px", "1"}},
           {{"t0", "0"}, {"t1", "1"}, {"px", "0"}}, {{"t0", "0"}, {"t1", "1"}, {"px", "99999999"}},
           {{"t0", "0"}, {"t1", "99999999999999999999999"}, {"px", "1"}}})
    EXPECT_EQ(app.Handle({"/window", q}).status, 400);
  EXPECT_EQ(app.Handle({"/etc/passwd", {}}).status, 404);
}

}  // namespace
}  // namespace spyglass::view
