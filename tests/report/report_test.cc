// `spyglass report`: the timeline's levels of detail (decoded back as the
// page decodes them), the flame graph of a known profile, the page's
// escaping, and the real CLI's errors (not a profile, truncated, newer format, missing run,
// a bad memory profile, an output it cannot write).
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <cstring>
#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/gzip.h"
#include "export/xplane/xplane_writer.h"
#include "memory/pprof.h"
#include "model/schema.h"
#include "report/flame.h"
#include "report/report.h"
#include "report/timeline.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
namespace report = spyglass::report;
namespace model = spyglass::model;
using spyglass::testing::MakeTempDir;
using spyglass::testing::ReadFile;

struct Span {
  int64_t start, end;
  uint32_t name, count;
  uint32_t detail = 0;  // id + 1
};

// The page's reading of a level's bytes (report.js, reader()), in C++.
struct BlobReader {
  const std::string& blob;
  size_t p;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      uint8_t b = static_cast<uint8_t>(blob.at(p++));
      v |= uint64_t{b & 127u} << shift;
      if (!(b & 128)) return v;
    }
  }
  int64_t zigzag() {
    uint64_t z = varint();
    return static_cast<int64_t>(z >> 1) ^ -static_cast<int64_t>(z & 1);
  }
  double f64() {
    double v;
    EXPECT_LE(p + 8, blob.size());
    std::memcpy(&v, blob.data() + p, 8);
    p += 8;
    return v;
  }
};

// The page's decoder (report.js, decode()), in C++.
std::vector<Span> Decode(const report::Timeline& tl, const report::TimelineTrack& t, const report::TimelineLevel& l) {
  std::vector<Span> out;
  BlobReader r{tl.blob, l.offset};
  int64_t prev = t.at_ns;
  for (uint64_t i = 0; i < l.spans; ++i) {
    Span s;
    s.start = prev + r.zigzag();
    s.end = s.start + static_cast<int64_t>(r.varint());
    s.name = static_cast<uint32_t>(r.varint());
    s.detail = static_cast<uint32_t>(r.varint());
    s.count = l.threshold_ns > 0 ? static_cast<uint32_t>(r.varint()) : 1;
    prev = s.end;
    out.push_back(s);
  }
  EXPECT_EQ(r.p, l.offset + l.bytes);
  return out;
}

// A megabyte name on every event of many threads is kept once, capped: the
// page stays the size of the input (a 20 MiB name made an 860 MiB page).
TEST(TimelineTest, HugeNamesAreCappedAndKeptOnce) {
  const std::string big = "op " + std::string(20 << 20, 'x');
  report::TimelineBuilder b;
  for (int t = 0; t < 30; ++t) {
    b.BeginLine("/host:CPU", "t" + std::to_string(t));
    for (int i = 0; i < 3; ++i) b.AddEvent(big, i * 1'000'000'000ll, 100'000'000);
    b.EndLine();
  }
  report::Timeline tl = b.Finish();
  ASSERT_EQ(tl.names.size(), 1u);
  EXPECT_EQ(tl.names[0], big.substr(0, report::kMaxNameLength) + "...(+" +
                             std::to_string(big.size() - report::kMaxNameLength) + " bytes)");
  EXPECT_EQ(tl.events, 90u);
}

TEST(TimelineTest, NestedEventsGoOneLanePerDepth) {
  report::TimelineBuilder b;
  b.BeginLine("/host:CPU", "main");
  // ps; given out of order: the builder sorts.
  b.AddEvent("child", 2'000'000, 3'000'000);
  b.AddEvent("parent", 1'000'000, 10'000'000);
  b.AddEvent("grandchild", 2'500'000, 1'000'000);
  b.AddEvent("sibling", 12'000'000, 1'000'000);
  b.AddEvent("overlaps_parent", 9'000'000, 2'500'000);  // not nested: below the busy lane
  b.EndLine();
  b.BeginLine("/device:GPU:0", "Stream #1");
  b.AddEvent("kernel", 500'000, 1'000'000);
  b.EndLine();
  report::Timeline tl = b.Finish();
  ASSERT_EQ(tl.tracks.size(), 2u);
  EXPECT_EQ(tl.events, 6u);
  EXPECT_EQ(tl.start_ns, 500);
  EXPECT_EQ(tl.duration_ns, 12'500);
  const report::TimelineTrack& main = tl.tracks[0];
  EXPECT_EQ(main.plane, "/host:CPU");
  EXPECT_EQ(main.at_ns, 500);
  ASSERT_EQ(main.lanes.size(), 3u);
  auto names = [&](const std::vector<Span>& spans) {
    std::vector<std::string> out;
    for (const Span& s : spans) out.push_back(tl.names[s.name]);
    return out;
  };
  auto lane0 = Decode(tl, main, main.lanes[0][0]);
  EXPECT_EQ(names(lane0), (std::vector<std::string>{"parent", "sibling"}));
  EXPECT_EQ(lane0[0].start, 500);  // ns from the first event of the run
  EXPECT_EQ(lane0[0].end, 10'500);
  EXPECT_EQ(names(Decode(tl, main, main.lanes[1][0])), (std::vector<std::string>{"child", "overlaps_parent"}));
  EXPECT_EQ(names(Decode(tl, main, main.lanes[2][0])), (std::vector<std::string>{"grandchild"}));
  auto kernel = Decode(tl, tl.tracks[1], tl.tracks[1].lanes[0][0]);
  ASSERT_EQ(kernel.size(), 1u);
  EXPECT_EQ(kernel[0].start, 0);
  EXPECT_EQ(kernel[0].end, 1'000);
}

// Many short events: each kept level halves the one before, at most about
// one span per threshold of time survives, and the events are all counted.
TEST(TimelineTest, LevelsOfDetailBoundWhatIsDrawn) {
  report::TimelineBuilder b;
  b.BeginLine("/host:CPU", "busy");
  constexpr int kEvents = 100'000;
  for (int i = 0; i < kEvents; ++i) b.AddEvent(i % 7 ? "short" : "longer", int64_t{i} * 150'000, i % 7 ? 100'000 : 140'000);
  // One wide event after a gap: never merged into the short ones.
  b.AddEvent("wide", int64_t{kEvents} * 150'000 + 50'000'000, 20'000'000'000);
  report::Timeline tl = b.Finish();
  const auto& levels = tl.tracks.at(0).lanes.at(0);
  ASSERT_GE(levels.size(), 3u);
  EXPECT_EQ(levels[0].threshold_ns, 0);
  EXPECT_EQ(levels[0].spans, kEvents + 1u);
  uint64_t all = 0;
  for (size_t k = 1; k < levels.size(); ++k) {
    EXPECT_GT(levels[k].threshold_ns, levels[k - 1].threshold_ns);
    EXPECT_LE(levels[k].spans * 2, levels[k - 1].spans) << "level " << k;
    auto spans = Decode(tl, tl.tracks[0], levels[k]);
    uint64_t counted = 0;
    for (const Span& s : spans) counted += s.count;
    EXPECT_EQ(counted, kEvents + 1u) << "level " << k;
    // Neighbours closer than the threshold are both wide.
    for (size_t i = 1; i < spans.size(); ++i)
      if (spans[i].start - spans[i - 1].end < levels[k].threshold_ns) {
        EXPECT_GE(spans[i].end - spans[i].start, levels[k].threshold_ns);
        EXPECT_GE(spans[i - 1].end - spans[i - 1].start, levels[k].threshold_ns);
      }
    all += levels[k].spans;
    // The wide event keeps its name at every level.
    EXPECT_EQ(tl.names[spans.back().name], "wide");
  }
  EXPECT_LE(all, levels[0].spans);  // all levels together: at most the events again
  // The coarsest level of a 15 ms stretch of events: a handful of spans.
  EXPECT_LE(levels.back().spans, 4u);
}

// Event details: one string per distinct detail, at most kMaxDetails of
// them (then counted), cut on a UTF-8 character boundary; merged spans
// carry none.
TEST(TimelineTest, DetailsAreInternedAndBounded) {
  report::TimelineBuilder b;
  b.BeginLine("/host:CPU", "main");
  const size_t n = report::kMaxDetails + 10;
  for (size_t i = 0; i < n; ++i) b.AddEvent("e", int64_t(i) * 10'000'000, 1'000'000, "request=" + std::to_string(i % (n - 5)));
  // A long detail ending in 3-byte characters: cut before one, not inside it.
  std::string longer(report::kMaxDetailLength - 1, 'x');
  for (int i = 0; i < 4; ++i) longer += "\u00e9\u4e2d";  // é, 中
  b.AddEvent("long", int64_t(n) * 10'000'000, 1'000'000, longer);
  report::Timeline tl = b.Finish();
  // n - 5 distinct strings wanted, kMaxDetails kept; the 5 repeats of kept
  // ones reuse theirs; "long" comes past the cap too.
  EXPECT_EQ(tl.details.size(), report::kMaxDetails);
  EXPECT_EQ(tl.hidden_details, (n - 5 - report::kMaxDetails) + 1);
  auto spans = Decode(tl, tl.tracks[0], tl.tracks[0].lanes[0][0]);
  ASSERT_EQ(spans.size(), n + 1);
  EXPECT_EQ(tl.details.at(spans[7].detail - 1), "request=7");
  EXPECT_EQ(spans[n - 5].detail, spans[0].detail);  // "request=0" again
  EXPECT_EQ(spans[report::kMaxDetails + 2].detail, 0u);  // past the cap
  for (const auto& level : tl.tracks[0].lanes[0])
    for (const Span& s : Decode(tl, tl.tracks[0], level))
      if (s.count > 1) EXPECT_EQ(s.detail, 0u);

  report::TimelineBuilder c;
  c.BeginLine("/host:CPU", "main");
  c.AddEvent("long", 0, 1000, longer);
  report::Timeline one = c.Finish();
  ASSERT_EQ(one.details.size(), 1u);
  EXPECT_EQ(one.details[0], std::string(report::kMaxDetailLength - 1, 'x'));  // é would straddle the cut
}

TEST(TimelineTest, TooDeepIsCountedNotDrawn) {
  report::TimelineBuilder b;
  b.BeginLine("/host:CPU", "deep");
  const int depth = static_cast<int>(report::kMaxLanes) + 10;
  for (int i = 0; i < depth; ++i) b.AddEvent("level", i * 1000, (depth - i) * 2000);
  report::Timeline tl = b.Finish();
  EXPECT_EQ(tl.tracks[0].lanes.size(), report::kMaxLanes);
  EXPECT_EQ(tl.tracks[0].hidden, 10u);
}

// Too many threads: the busiest kMaxTracks are kept, the rest counted; times
// at the ends of int64 do not overflow.
TEST(TimelineTest, ManyThreadsAndExtremeTimes) {
  report::TimelineBuilder b;
  const size_t n = report::kMaxTracks + 5;
  for (size_t i = 0; i < n; ++i) {
    b.BeginLine("/host:CPU", "t" + std::to_string(i));
    // Thread i has 1 event, except the last 5 which have 3: 5 of one event go.
    for (int k = 0; k < (i >= report::kMaxTracks ? 3 : 1); ++k) b.AddEvent("e", int64_t{k} * 1000, 500);
    b.EndLine();
  }
  report::Timeline tl = b.Finish();
  EXPECT_EQ(tl.tracks.size(), report::kMaxTracks);
  EXPECT_EQ(tl.hidden_tracks, 5u);
  EXPECT_EQ(tl.hidden_track_events, 5u);
  // The busiest first (in the order given), then the others in the order given.
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(tl.tracks[i].name, "t" + std::to_string(report::kMaxTracks + i));
  EXPECT_EQ(tl.tracks[5].name, "t0");  // of one event each, the last five given are left out
  EXPECT_EQ(tl.tracks.back().name, "t" + std::to_string(report::kMaxTracks - 6));

  report::TimelineBuilder x;
  x.BeginLine("/host:CPU", "odd");
  x.AddEvent("late", INT64_MAX - 10, INT64_MAX);
  x.AddEvent("negative", -5'000, -1);
  report::Timeline odd = x.Finish();
  ASSERT_EQ(odd.tracks.size(), 1u);
  EXPECT_EQ(odd.events, 2u);
  EXPECT_GE(odd.duration_ns, 0);
}

// A level of more than kChunkSpans spans marks where each chunk starts:
// decoding from a mark gives the spans the whole decode gives there.
TEST(TimelineTest, ChunkMarksStartDecodingMidLevel) {
  report::TimelineBuilder b;
  b.BeginLine("/host:CPU", "busy");
  const int n = 3 * static_cast<int>(report::kChunkSpans) + 100;
  for (int i = 0; i < n; ++i) b.AddEvent(i % 3 ? "a" : "b", 7'000'000 + int64_t{i} * 3'000'000, 1'000'000 + (i % 5) * 1000);
  b.EndLine();
  b.BeginLine("/host:CPU", "small");
  b.AddEvent("x", 0, 1000);
  b.EndLine();
  report::Timeline tl = b.Finish();
  const report::TimelineTrack& t = tl.tracks[0];
  const report::TimelineLevel& l = t.lanes[0][0];
  ASSERT_EQ(l.marks.size(), 2u * 4);  // chunks of 8192, 8192, 8192, 100
  auto all = Decode(tl, t, l);
  for (size_t c = 0; c < 4; ++c) {
    report::TimelineLevel from = l;
    from.offset = l.offset + static_cast<uint64_t>(l.marks[2 * c]);
    from.spans = std::min<uint64_t>(report::kChunkSpans, l.spans - c * report::kChunkSpans);
    from.bytes = (c + 1 < 4 ? static_cast<uint64_t>(l.marks[2 * c + 2]) : l.bytes) - static_cast<uint64_t>(l.marks[2 * c]);
    report::TimelineTrack at = t;
    at.at_ns = t.at_ns + l.marks[2 * c + 1];
    auto part = Decode(tl, at, from);
    ASSERT_EQ(part.size(), from.spans);
    const Span& want = all[c * report::kChunkSpans];
    EXPECT_EQ(part[0].start, want.start) << "chunk " << c;
    EXPECT_EQ(part.back().end, all[c * report::kChunkSpans + part.size() - 1].end) << "chunk " << c;
    EXPECT_EQ(part[0].name, want.name);
  }
  EXPECT_TRUE(tl.tracks[1].lanes[0][0].marks.empty());
}

// What matters first: host planes, then each device, a plane's threads
// together and the busiest first (40 one-event loaders after the trainer).
TEST(TimelineTest, BusiestThreadsFirstGroupedByPlane) {
  report::TimelineBuilder b;
  auto line = [&](const char* plane, std::string name, int events) {
    b.BeginLine(plane, name);
    for (int i = 0; i < events; ++i) b.AddEvent("e", int64_t{i} * 1000, 500);
    b.EndLine();
  };
  line("/device:GPU:0", "Stream #1", 2);
  for (int i = 0; i < 40; ++i) line("/host:CPU", "loader" + std::to_string(i), 1);
  line("/device:GPU:1", "Stream #9", 7);
  line("/host:CPU", "trainer", 283);
  line("/device:GPU:0", "Stream #2", 5);
  report::Timeline tl = b.Finish();
  ASSERT_EQ(tl.tracks.size(), 44u);
  EXPECT_EQ(tl.tracks[0].name, "trainer");
  EXPECT_EQ(tl.tracks[1].name, "loader0");
  EXPECT_EQ(tl.tracks[40].name, "loader39");
  EXPECT_EQ(tl.tracks[41].name, "Stream #2");  // GPU 0's busiest stream
  EXPECT_EQ(tl.tracks[42].name, "Stream #1");
  EXPECT_EQ(tl.tracks[43].name, "Stream #9");  // GPU 1 after GPU 0, as given
  EXPECT_EQ(tl.name_events, (std::vector<uint64_t>{2 + 40 + 7 + 283 + 5}));
}

// Events of one correlation id (a launch and its kernel) become an arrow
// from the earlier one, its ends by track, lane and start; an id seen once
// makes none.
TEST(TimelineTest, FlowsJoinCorrelatedEvents) {
  report::TimelineBuilder b;
  b.BeginLine("/device:GPU:0", "Stream #7");
  b.AddEvent("gemm", 5'000'000, 1'000'000, "", 42);
  b.AddEvent("lonely", 9'000'000, 1'000'000, "", 77);
  b.EndLine();
  b.BeginLine("/host:CPU", "main");
  b.AddEvent("step", 0, 20'000'000);
  b.AddEvent("cudaLaunchKernel", 1'000'000, 500'000, "", 42);
  b.EndLine();
  report::Timeline tl = b.Finish();
  ASSERT_EQ(tl.tracks.size(), 2u);
  ASSERT_EQ(tl.tracks[0].name, "main");
  ASSERT_EQ(tl.flows.size(), 1u);
  const report::TimelineFlow& f = tl.flows[0];
  EXPECT_EQ(f.from_track, 0u);  // main, after the sort
  EXPECT_EQ(f.from_lane, 1u);
  EXPECT_EQ(f.from_ns, 1'000);
  EXPECT_EQ(f.to_track, 1u);
  EXPECT_EQ(f.to_lane, 0u);
  EXPECT_EQ(f.to_ns, 5'000);
}

// A page over its budget drops the finest levels of its biggest lanes
// until it fits, and says what it dropped; the coarser levels stay whole.
TEST(ReportPageTest, BoundedSizeCoarsensAndSaysSo) {
  report::TimelineBuilder b;
  b.BeginLine("/host:CPU", "busy");
  // 400k events with varied gaps and durations (not all alike: they must not compress to nothing).
  uint64_t x = 88172645463325252ull;
  int64_t t = 0;
  for (int i = 0; i < 400000; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    // 0.1-50 us, 0-20 us apart: the first level that halves them merges at 65 us, 1/20 of the spans.
    int64_t d = 100'000 + static_cast<int64_t>(x % 50'000) * 1000;
    b.AddEvent(i % 2 ? "a" : "b", t, d);
    t += d + static_cast<int64_t>((x >> 40) % 20'000) * 1000;
  }
  b.EndLine();
  b.BeginLine("/host:CPU", "quiet");
  b.AddEvent("once", 0, 1'000'000);
  b.EndLine();
  report::ReportInput in;
  in.title = "big";
  in.timeline = b.Finish();
  const size_t full = report::RenderReport(in).size();
  ASSERT_EQ(in.timeline.coarsened_lanes, 0u);
  report::ReportInput small;
  small.title = "big";
  small.timeline = in.timeline;
  small.max_page_bytes = full / 2;
  std::string html = report::RenderReport(small);
  EXPECT_LE(html.size(), small.max_page_bytes);
  // What detail fits is kept: a level in between, not the next one alone
  // (which made a page of a tenth of the budget).
  EXPECT_GE(html.size(), small.max_page_bytes * 4 / 10);
  EXPECT_EQ(small.timeline.coarsened_lanes, 1u);  // busy's, not quiet's
  EXPECT_EQ(small.timeline.coarsened_events, 400000u);
  EXPECT_GT(small.timeline.coarsened_ns, 0);
  EXPECT_NE(html.find("\"coarsened_events\":400000"), std::string::npos);
  // Every level kept decodes whole; quiet keeps its event.
  for (const auto& t : small.timeline.tracks)
    for (const auto& lane : t.lanes) {
      ASSERT_FALSE(lane.empty());
      for (const auto& level : lane) EXPECT_EQ(Decode(small.timeline, t, level).size(), level.spans);
    }
  EXPECT_EQ(small.timeline.tracks[1].lanes[0][0].threshold_ns, 0);
}

// The page's counter decoder (report.js, decodeCounter()), in C++.
struct Point {
  int64_t ns;
  double lo, hi, last;
};
std::vector<Point> DecodeCounter(const report::Timeline& tl, const report::TimelineCounter& c, const report::TimelineLevel& l) {
  std::vector<Point> out;
  BlobReader r{tl.blob, l.offset};
  int64_t prev = c.at_ns;
  for (uint64_t i = 0; i < l.spans; ++i) {
    Point pt;
    pt.ns = prev + r.zigzag();
    prev = pt.ns;
    if (l.threshold_ns > 0) {
      pt.lo = r.f64();
      pt.hi = r.f64();
    }
    pt.last = r.f64();
    if (l.threshold_ns == 0) pt.lo = pt.hi = pt.last;
    out.push_back(pt);
  }
  EXPECT_EQ(r.p, l.offset + l.bytes);
  return out;
}

// 100k samples of a sawtooth with one spike and one dip: every level keeps
// both extremes and the value the series ends on, and halves the points.
TEST(TimelineTest, CountersKeepExtremesAtEveryLevel) {
  report::TimelineBuilder b;
  b.BeginLine("/host:CPU", "main");
  b.AddEvent("work", 5'000'000, 1'000'000);  // 5 us in: the counter starts earlier
  b.EndLine();
  constexpr int kSamples = 100'000;
  // Given out of order: the builder sorts by time.
  for (int i = kSamples - 1; i >= 0; --i) {
    double v = (i % 100) * 1024.0;
    if (i == 77'777) v = 1e9;   // the spike
    if (i == 33'333) v = -5.0;  // the dip
    b.AddCounterSample("/host:CPU", "memory cpu", int64_t{i} * 1'000'000, v, true);  // one a microsecond
  }
  report::Timeline tl = b.Finish();
  EXPECT_EQ(tl.start_ns, 0);  // the first sample, before the first event
  EXPECT_EQ(tl.tracks.at(0).at_ns, 5'000);
  EXPECT_EQ(tl.duration_ns, int64_t{kSamples - 1} * 1000);
  ASSERT_EQ(tl.counters.size(), 1u);
  const report::TimelineCounter& c = tl.counters[0];
  EXPECT_EQ(c.name, "memory cpu");
  EXPECT_TRUE(c.bytes);
  EXPECT_EQ(c.samples, uint64_t{kSamples});
  EXPECT_EQ(c.min, -5.0);
  EXPECT_EQ(c.max, 1e9);
  ASSERT_GE(c.levels.size(), 4u);
  auto raw = DecodeCounter(tl, c, c.levels[0]);
  ASSERT_EQ(raw.size(), size_t{kSamples});
  EXPECT_EQ(raw[12'345].ns, 12'345'000);
  EXPECT_EQ(raw[12'345].last, 45 * 1024.0);
  for (size_t k = 1; k < c.levels.size(); ++k) {
    const report::TimelineLevel& l = c.levels[k];
    EXPECT_GT(l.threshold_ns, c.levels[k - 1].threshold_ns);
    EXPECT_LE(l.spans * 2, c.levels[k - 1].spans) << "level " << k;
    auto pts = DecodeCounter(tl, c, l);
    double lo = pts[0].lo, hi = pts[0].hi;
    for (const Point& pt : pts) lo = std::min(lo, pt.lo), hi = std::max(hi, pt.hi);
    EXPECT_EQ(lo, -5.0) << "level " << k;
    EXPECT_EQ(hi, 1e9) << "level " << k;
    EXPECT_EQ(pts.back().last, raw.back().last) << "level " << k;
    EXPECT_EQ(pts.front().ns, 0) << "level " << k;  // a bucket's point is at its first sample
    // Each point's bucket is its own.
    for (size_t i = 1; i < pts.size(); ++i) EXPECT_NE(pts[i].ns / l.threshold_ns, pts[i - 1].ns / l.threshold_ns);
  }
  EXPECT_LE(c.levels.back().spans, 4u);
}

// Past kMaxCounters, and values that are not numbers: counted, not kept (a
// counter with no finite value is left out); a run of counters alone still
// has a time base.
TEST(TimelineTest, CountersBoundedAndNonFiniteCounted) {
  report::TimelineBuilder b;
  b.AddCounterSample("/device:GPU:0", "only infinite", 7000 * 1000, INFINITY, false);  // takes the first place
  const size_t n = report::kMaxCounters + 3;
  for (size_t i = 0; i < n; ++i)
    for (int k = 0; k < 2; ++k) b.AddCounterSample("/device:GPU:0", "metric " + std::to_string(i), (1000 + k) * 1000, k, false);
  b.AddCounterSample("/device:GPU:0", "metric 0", 5000 * 1000, std::nan(""), false);
  report::Timeline tl = b.Finish();
  EXPECT_TRUE(tl.tracks.empty());
  ASSERT_EQ(tl.counters.size(), report::kMaxCounters - 1);  // "only infinite" left out
  EXPECT_EQ(tl.counters[0].name, "metric 0");
  EXPECT_EQ(tl.counters[0].samples, 2u);
  EXPECT_EQ(tl.counters.back().name, "metric " + std::to_string(report::kMaxCounters - 2));
  EXPECT_EQ(tl.hidden_counters, 4u);
  EXPECT_EQ(tl.hidden_counter_samples, 4u * 2 + 2);
  EXPECT_EQ(tl.start_ns, 1000);
  EXPECT_EQ(tl.duration_ns, 1);
  EXPECT_EQ(tl.counters[0].at_ns, 0);

  // Times at the ends of int64: no overflow (scripts/sanitizers.sh runs
  // this test under UBSan), every sample kept.
  report::TimelineBuilder x;
  for (int64_t t : {INT64_MAX, INT64_MIN, int64_t{0}, INT64_MAX - 1, INT64_MIN + 1})
    x.AddCounterSample("/host:CPU", "odd", t, 1, false);
  report::Timeline odd = x.Finish();
  ASSERT_EQ(odd.counters.size(), 1u);
  EXPECT_EQ(odd.counters[0].samples, 5u);
  EXPECT_GE(odd.duration_ns, 0);
  auto pts = DecodeCounter(odd, odd.counters[0], odd.counters[0].levels.back());
  ASSERT_FALSE(pts.empty());
  EXPECT_EQ(pts.front().ns, 0);  // the earliest sample is the time base
}

// A profile with known stacks: main -> build_table (640 KiB), main ->
// grow_cache (500 KiB, through operator new).
spyglass::memory::PprofProfile KnownProfile() {
  spyglass::memory::ProfileData d;
  d.functions = {{"main", "main", "w.cc", 1}, {"build_table()", "", "w.cc", 10}, {"grow_cache(int)", "", "w.cc", 20},
                 {"operator new(unsigned long)", "", "new.cc", 1}};
  d.locations = {{0x10, {{1, 5}}}, {0x20, {{2, 12}}}, {0x30, {{3, 22}}}, {0x40, {{4, 2}}}};
  d.samples = {{{2, 1}, 10, 640 << 10, "heap", "cpu:0"}, {{4, 3, 1}, 500, 500 << 10, "heap", "cpu:0"}};
  spyglass::memory::PprofProfile p;
  EXPECT_TRUE(spyglass::memory::ParsePprof(spyglass::memory::EncodePprofGz(d), &p).ok());
  return p;
}

TEST(FlameTest, KnownProfile) {
  report::FlameGraph g = report::BuildFlameGraph(KnownProfile(), "memory.1.exit.prof");
  EXPECT_EQ(g.unit, "bytes");
  EXPECT_EQ(g.total, (640 + 500) << 10);
  // Preorder, largest child first.
  std::vector<std::string> order;
  for (size_t i = 0; i < g.node_name.size(); ++i)
    order.push_back(g.names[g.node_name[i]] + "@" + std::to_string(g.node_depth[i]) + "=" +
                    std::to_string(g.node_value[i] >> 10));
  EXPECT_EQ(order, (std::vector<std::string>{"all@0=1140", "main@1=1140", "build_table()@2=640",
                                             "grow_cache(int)@2=500", "operator new(unsigned long)@3=500"}));
  ASSERT_EQ(g.top_sites.size(), 2u);
  EXPECT_EQ(g.top_sites[0].site.substr(0, 13), "build_table()");
  EXPECT_EQ(g.top_sites[0].count, 10);
  EXPECT_EQ(g.top_sites[1].site.substr(0, 15), "grow_cache(int)");  // past the allocator frame
  EXPECT_EQ(g.top_sites[1].value, 500 << 10);
}

// The page's stacks: each distinct one once, root first, largest first,
// with file:line and the frame's kind; beyond kMaxFlameStacks, counted.
TEST(FlameTest, StacksForThePage) {
  report::FlameGraph g = report::BuildFlameGraph(KnownProfile(), "memory.1.exit.prof");
  ASSERT_EQ(g.stack_sizes, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(g.stack_values, (std::vector<int64_t>{640 << 10, 500 << 10}));
  EXPECT_EQ(g.stack_counts, (std::vector<int64_t>{10, 500}));
  auto frame = [&](size_t i) {
    const report::FlameFrame& f = g.frames[g.stack_frames[i]];
    return f.function + "@" + f.file + ":" + std::to_string(f.line) + (f.python ? " py" : "") + (f.interpreter ? " interp" : "");
  };
  EXPECT_EQ(frame(0), "main@w.cc:5");
  EXPECT_EQ(frame(1), "build_table()@w.cc:12");
  EXPECT_EQ(frame(2), "main@w.cc:5");  // the same frame, one id
  EXPECT_EQ(g.stack_frames[2], g.stack_frames[0]);
  EXPECT_EQ(frame(4), "operator new(unsigned long)@new.cc:2");
  EXPECT_EQ(g.hidden_stacks, 0u);

  // A Python program: Python frames marked, the interpreter's marked (not
  // left out: the page folds them), the same C name outside Python kept native.
  spyglass::memory::ProfileData d;
  d.functions = {{"_PyEval_EvalFrameDefault", "", "", 0}, {"load", "", "/srv/app.py", 3}, {"malloc", "", "", 0}};
  d.locations = {{0x10, {{1, 0}}}, {0x20, {{2, 7}}}, {0x30, {{3, 0}}}};
  d.samples = {{{3, 2, 1}, 1, 64, "heap", "cpu:0"}, {{3, 1}, 1, 32, "heap", "cpu:0"}};
  spyglass::memory::PprofProfile p;
  ASSERT_TRUE(spyglass::memory::ParsePprof(spyglass::memory::EncodePprofGz(d), &p).ok());
  report::FlameGraph py = report::BuildFlameGraph(p, "py.prof");
  ASSERT_EQ(py.stack_sizes, (std::vector<uint32_t>{3, 2}));
  auto kind = [&](size_t i) {
    const report::FlameFrame& f = py.frames[py.stack_frames[i]];
    return f.function + (f.python ? " py" : "") + (f.interpreter ? " interp" : "");
  };
  EXPECT_EQ(kind(0), "_PyEval_EvalFrameDefault interp");
  EXPECT_EQ(kind(1), "load py");
  EXPECT_EQ(kind(2), "malloc");
  EXPECT_EQ(kind(3), "_PyEval_EvalFrameDefault");  // no Python frame in that stack
  EXPECT_TRUE(py.fold);
  EXPECT_FALSE(report::BuildFlameGraph(p, "py.prof", {.fold_interpreter = false}).fold);

  // Past kMaxFlameStacks distinct stacks: the smallest counted, not kept.
  spyglass::memory::ProfileData many;
  const size_t n = report::kMaxFlameStacks + 3;
  for (size_t i = 0; i < n; ++i) {
    many.functions.push_back({"f" + std::to_string(i), "", "m.cc", 1});
    many.locations.push_back({0x10 * (i + 1), {{i + 1, 1}}});
    many.samples.push_back({{i + 1}, 1, static_cast<int64_t>(i + 1), "heap", "cpu:0"});
  }
  spyglass::memory::PprofProfile mp;
  ASSERT_TRUE(spyglass::memory::ParsePprof(spyglass::memory::EncodePprofGz(many), &mp).ok());
  report::FlameGraph mg = report::BuildFlameGraph(mp, "many.prof");
  EXPECT_EQ(mg.stack_sizes.size(), report::kMaxFlameStacks);
  EXPECT_EQ(mg.hidden_stacks, 3u);
  EXPECT_EQ(mg.hidden_value, 1 + 2 + 3);
}

// Several devices: a subtree each; negative values (not a live-memory
// profile) weigh nothing and are counted.
TEST(FlameTest, DevicesAndNegativeValues) {
  spyglass::memory::ProfileData d;
  d.functions = {{"main", "", "w.cc", 1}, {"upload", "", "w.cc", 2}};
  d.locations = {{0x10, {{1, 5}}}, {0x20, {{2, 9}}}};
  d.samples = {{{1}, 1, 100, "heap", "cpu:0"}, {{2, 1}, 1, 300, "device", "gpu:0"}, {{1}, 1, -50, "heap", "cpu:0"}};
  spyglass::memory::PprofProfile p;
  ASSERT_TRUE(spyglass::memory::ParsePprof(spyglass::memory::EncodePprofGz(d), &p).ok());
  report::FlameGraph g = report::BuildFlameGraph(p, "x.prof");
  EXPECT_EQ(g.total, 400);
  EXPECT_EQ(g.negative_samples, 1u);
  std::vector<std::string> order;
  for (size_t i = 0; i < g.node_name.size(); ++i) order.push_back(g.names[g.node_name[i]] + "=" + std::to_string(g.node_value[i]));
  EXPECT_EQ(order, (std::vector<std::string>{"all=400", "[gpu:0 device]=300", "main=300", "upload=300",
                                             "[cpu:0 heap]=100", "main=100"}));
}

// A Python program's flame graph starts at its own code: the interpreter's and
// runpy's frames are folded away (and counted), unless asked to keep them.
TEST(FlameTest, InterpreterFramesFoldAway) {
  spyglass::memory::ProfileData d;
  d.functions = {{"_start", "", "", 0},
                 {"__libc_start_main", "", "", 0},
                 {"main", "", "", 0},
                 {"Py_RunMain", "", "", 0},
                 {"_run_module_as_main", "", "<frozen runpy>", 198},
                 {"_run_code", "", "<frozen runpy>", 88},
                 {"main", "", "/usr/lib/python3.11/json/tool.py", 67},
                 {"_PyEval_EvalFrameDefault", "", "", 0},
                 {"raw_decode", "", "/usr/lib/python3.11/json/decoder.py", 353},
                 {"PyUnicode_New", "", "", 0},
                 {"malloc", "", "", 0}};
  for (uint64_t i = 1; i <= d.functions.size(); ++i) d.locations.push_back({0x10 * i, {{i, 1}}});
  d.samples = {{{11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, 1, 4096, "heap", "cpu:0"}};
  spyglass::memory::PprofProfile p;
  ASSERT_TRUE(spyglass::memory::ParsePprof(spyglass::memory::EncodePprofGz(d), &p).ok());
  auto names = [](const report::FlameGraph& g) {
    std::vector<std::string> out;
    for (uint32_t n : g.node_name) out.push_back(g.names[n]);
    return out;
  };
  report::FlameGraph folded = report::BuildFlameGraph(p, "x.prof");
  EXPECT_EQ(names(folded), (std::vector<std::string>{"all", "main", "raw_decode", "PyUnicode_New", "malloc"}));
  EXPECT_EQ(folded.folded_frames, 7u);
  report::FlameGraph all = report::BuildFlameGraph(p, "x.prof", {.fold_interpreter = false});
  EXPECT_EQ(all.node_name.size(), 12u);
  EXPECT_EQ(all.folded_frames, 0u);
  // A native program keeps every frame, main and _start included.
  report::FlameGraph native = report::BuildFlameGraph(KnownProfile(), "y.prof");
  EXPECT_EQ(native.folded_frames, 0u);
}

// Names come from the profile: a name that closes the script element or
// starts a comment must stay data.
TEST(ReportPageTest, NamesCannotEndTheScript) {
  report::TimelineBuilder b;
  b.BeginLine("/host:CPU", "</script><script>alert(1)</script>");
  b.AddEvent("<!--<script>", 0, 1000);
  report::ReportInput in;
  in.title = "<b>run</b>";
  in.timeline = b.Finish();
  in.summary_json = R"({"note":"</script>"})";
  std::string html = report::RenderReport(in);
  size_t scripts = 0;
  for (size_t at = html.find("</script"); at != std::string::npos; at = html.find("</script", at + 1)) ++scripts;
  EXPECT_EQ(scripts, 3u);  // data, timeline, code
  EXPECT_EQ(html.find("<!--<script>"), std::string::npos);
  EXPECT_EQ(html.find("<b>run</b>"), std::string::npos);
  EXPECT_NE(html.find("\\u003c/script>\\u003cscript>alert(1)"), std::string::npos);
  // Nothing to fetch: no src= or href= to anything but the page's own anchors.
  EXPECT_EQ(html.find(" src="), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
}

// The page's data (the JSON in its sg-data script); null if it has none.
nlohmann::json PageData(const std::string& html) {
  const std::string open = "<script id=\"sg-data\" type=\"application/json\">";
  size_t a = html.find(open);
  if (a == std::string::npos) return nullptr;
  a += open.size();
  return nlohmann::json::parse(html.substr(a, html.find("</script>", a) - a));
}

// A CPU profile (cpu.<pid>.<comm>.prof): two threads, one annotation. The
// page's CPU flame data keeps each stack's thread and annotation, values in
// CPU nanoseconds and counts in samples.
TEST(FlameTest, CpuProfileByThreadAndAnnotation) {
  spyglass::memory::ProfileData d;
  d.sample_types = {{"samples", "count"}, {"cpu", "nanoseconds"}};
  d.functions = {{"main", "main", "w.cc", 1}, {"spin_a()", "", "w.cc", 10}, {"spin_b()", "", "w.cc", 20}};
  d.locations = {{0x10, {{1, 5}}}, {0x20, {{2, 12}}}, {0x30, {{3, 22}}}};
  constexpr int64_t kPeriod = 10'000'000;
  d.samples = {{{2, 1}, 30, 30 * kPeriod, "", "", {{"thread", "worker-a 11"}, {"annotation", "step::train"}}},
               {{2, 1}, 5, 5 * kPeriod, "", "", {{"thread", "worker-a 11"}}},
               {{3, 1}, 12, 12 * kPeriod, "", "", {{"thread", "worker-b 12"}}}};
  spyglass::memory::PprofProfile p;
  ASSERT_TRUE(spyglass::memory::ParsePprof(spyglass::memory::EncodePprofGz(d), &p).ok());
  report::ReportInput in;
  in.cpu_flames.push_back(report::BuildCpuFlameGraph(p, "cpu.1.w.prof"));
  EXPECT_EQ(in.cpu_flames[0].total, 47 * kPeriod);
  EXPECT_TRUE(in.cpu_flames[0].top_sites.empty());
  std::string html = report::RenderReport(in);
  nlohmann::json data = PageData(html);
  ASSERT_TRUE(data.is_object());
  ASSERT_EQ(data["cpu_flames"].size(), 1u);
  const nlohmann::json& g = data["cpu_flames"][0];
  EXPECT_EQ(g["unit"], "nanoseconds");
  EXPECT_EQ(g["cpu"], true);
  // Samples and CPU time of each (thread, annotation, leaf function).
  std::map<std::string, std::pair<int64_t, int64_t>> got;
  size_t off = 0;
  for (size_t i = 0; i < g["stack_sizes"].size(); ++i) {
    size_t n = g["stack_sizes"][i];
    uint32_t leaf = g["stack_frames"][off + n - 1];
    uint32_t root = g["stack_frames"][off];
    off += n;
    std::string key = g["threads"][g["stack_thread"][i].get<size_t>()].get<std::string>() + "|" +
                      g["annotations"][g["stack_annotation"][i].get<size_t>()].get<std::string>() + "|" +
                      g["strings"][g["frame_fn"][root].get<size_t>()].get<std::string>() + ">" +
                      g["strings"][g["frame_fn"][leaf].get<size_t>()].get<std::string>();
    got[key].first += g["stack_counts"][i].get<int64_t>();
    got[key].second += g["stack_values"][i].get<int64_t>();
  }
  std::map<std::string, std::pair<int64_t, int64_t>> want = {
      {"worker-a 11|step::train|main>spin_a()", {30, 30 * kPeriod}},
      {"worker-a 11||main>spin_a()", {5, 5 * kPeriod}},
      {"worker-b 12||main>spin_b()", {12, 12 * kPeriod}}};
  EXPECT_EQ(got, want);
}

// ---- the real CLI ----------------------------------------------------------------
struct Result {
  int code;
  std::string out;
};

Result Cli(const std::string& args) {
  const char* cli = std::getenv("SPYGLASS_CLI");
  std::string cmd = std::string(cli ? cli : "spyglass") + " report " + args + " 2>&1";
  Result r{-1, ""};
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) r.out.append(buf.data(), n);
  int status = pclose(f);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The known CPU workload under `spyglass run --sample`: the page's CPU flame
// data has burn_a and burn_b on the main thread, burn_a, burn_b and burn_c on
// the worker, each stack's CPU time its samples times the period.
TEST(ReportCpuCliTest, SampledRunHasCpuFlame) {
  const char* cli = std::getenv("SPYGLASS_CLI");
  const char* workload = std::getenv("SPYGLASS_CPU_WORKLOAD");
  if (!cli || !workload) GTEST_SKIP() << "SPYGLASS_CLI or SPYGLASS_CPU_WORKLOAD not set";
#if defined(__SANITIZE_ADDRESS__)
  // `spyglass run` preloads the heap hook, which replaces malloc under the
  // program: not with ASan's allocator (the other builds run this test).
  GTEST_SKIP() << "spyglass run's preloaded heap hook and ASan's allocator do not mix";
#endif
  std::string dir = MakeTempDir("spyglass-report-cpu");
  std::string run = std::string(cli) + " run --sample 999 -o " + dir + " -- " + workload + " 1 >/dev/null 2>&1";
  ASSERT_EQ(std::system(run.c_str()), 0) << run;
  Result r = Cli(dir + " -o " + dir + "/r.html");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 CPU profile"), std::string::npos) << r.out;
  std::string html = ReadFile(dir + "/r.html");
  nlohmann::json data = PageData(html);
  ASSERT_TRUE(data.is_object());
  ASSERT_EQ(data["cpu_flames"].size(), 1u);
  const nlohmann::json& g = data["cpu_flames"][0];
  EXPECT_EQ(g["unit"], "nanoseconds");
  // Samples by (thread name without its tid, leaf function).
  std::map<std::string, int64_t> samples;
  int64_t total = 0, period = 0;
  size_t off = 0;
  for (size_t i = 0; i < g["stack_sizes"].size(); ++i) {
    size_t n = g["stack_sizes"][i];
    uint32_t leaf = g["stack_frames"][off + n - 1];
    off += n;
    std::string thread = g["threads"][g["stack_thread"][i].get<size_t>()].get<std::string>();
    thread = thread.substr(0, thread.rfind(' '));
    int64_t count = g["stack_counts"][i], value = g["stack_values"][i];
    ASSERT_GT(count, 0);
    if (period == 0) period = value / count;
    EXPECT_EQ(value, count * period) << "stack " << i;
    samples[thread + "/" + g["strings"][g["frame_fn"][leaf].get<size_t>()].get<std::string>()] += count;
    total += value;
  }
  EXPECT_EQ(total, g["total"].get<int64_t>());
  for (const char* k : {"cpu_workload/burn_a", "cpu_workload/burn_b", "worker/burn_a", "worker/burn_b", "worker/burn_c"})
    EXPECT_GT(samples[k], 10) << k;
  EXPECT_EQ(samples["cpu_workload/burn_c"], 0);  // the main thread never runs burn_c
  // On the timeline, each sample is a span named after its function (not
  // its stack node's name, cpu_stack#<n>), and the samples with their times
  // are there for the flame graph of a range: as many as in the profile.
  bool named = false, node_names = false;
  for (const auto& n : data["timeline"]["names"]) {
    named = named || n == "burn_a";
    node_names = node_names || n.get<std::string>().rfind("cpu_stack#", 0) == 0;
  }
  EXPECT_TRUE(named);
  EXPECT_FALSE(node_names);
  int64_t counted = 0;
  for (const auto& [k, n] : samples) counted += n;
  ASSERT_EQ(data["cpu_samples"].size(), 1u);
  EXPECT_EQ(data["cpu_samples"][0]["samples"].get<int64_t>(), counted);
  EXPECT_EQ(data["cpu_samples"][0]["threads"].size(), 2u);
  fs::remove_all(dir);
}

class ReportCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::getenv("SPYGLASS_CLI")) GTEST_SKIP() << "SPYGLASS_CLI not set";
    dir_ = MakeTempDir("spyglass-report");
    model::Space space;
    space.plane(model::kHostPlaneName);
    model::Plane& host = space.planes[0];
    host.line_with_id(1).name = "main";
    host.lines[0].events.push_back({0, 5'000'000, host.intern_event("work")});
    good_ = dir_ + "/good.xplane.pb";
    ASSERT_TRUE(spyglass::exporter::WriteXSpaceFile(space, good_).ok());
  }
  void Write(const std::string& name, const std::string& bytes) {
    ASSERT_TRUE(spyglass::exporter::WriteOutputBytes(dir_ + "/" + name, bytes).ok());
  }
  std::string dir_, good_;
};

TEST_F(ReportCliTest, WritesThePage) {
  Result r = Cli(good_ + " -o " + dir_ + "/r.html");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 events on 1 threads"), std::string::npos) << r.out;
  std::string html = ReadFile(dir_ + "/r.html");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("\"name\":\"main\""), std::string::npos);
}

TEST_F(ReportCliTest, NotAProfile) {
  Write("text.xplane.pb", "this is not a profile, just some text\n");
  Result r = Cli(dir_ + "/text.xplane.pb -o " + dir_ + "/r.html");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("is not a profile"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ + "/r.html"));
}

TEST_F(ReportCliTest, Truncated) {
  std::string bytes = ReadFile(good_);
  Write("cut.xplane.pb", bytes.substr(0, bytes.size() / 2));
  Result r = Cli(dir_ + "/cut.xplane.pb -o " + dir_ + "/r.html");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("truncated"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ + "/r.html"));
}

TEST_F(ReportCliTest, NewerFormat) {
  model::Space space;
  space.plane(model::kHostPlaneName);
  space.plane(model::kMetadataPlaneName);
  space.planes[0].line_with_id(1).events.push_back({0, 1000, space.planes[0].intern_event("work")});
  model::Plane& md = space.planes[1];
  md.stats.push_back(md.int_stat(model::kFormatVersionMetadata, 99));
  ASSERT_TRUE(spyglass::exporter::WriteXSpaceFile(space, dir_ + "/newer.xplane.pb").ok());
  Result r = Cli(dir_ + "/newer.xplane.pb -o " + dir_ + "/r.html");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("newer format"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ + "/r.html"));
}

TEST_F(ReportCliTest, MissingRunAndEmptyFolder) {
  Result r = Cli(dir_ + "/no_such_run -o " + dir_ + "/r.html");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("no such file or folder"), std::string::npos) << r.out;
  fs::create_directory(dir_ + "/empty");
  r = Cli(dir_ + "/empty -o " + dir_ + "/r.html");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("no .xplane.pb in"), std::string::npos) << r.out;
  // A path quoted in an error is bounded.
  r = Cli(dir_ + "/" + std::string(200, 'x') + " -o " + dir_ + "/r.html");
  EXPECT_EQ(r.code, 1);
  EXPECT_LT(r.out.size(), 400u) << r.out;
  EXPECT_FALSE(fs::exists(dir_ + "/r.html"));
}

TEST_F(ReportCliTest, BadMemoryProfile) {
  Write("memory.1.exit.prof", std::string("\x1f\x8b\x08\x00garbage", 11));
  // Named with --memory: an error.
  Result r = Cli(good_ + " -o " + dir_ + "/r.html --memory " + dir_ + "/memory.1.exit.prof");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("not a valid pprof profile"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ + "/r.html"));
  // Found next to the run: left out, and the page says why.
  r = Cli(good_ + " -o " + dir_ + "/r.html");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("0 memory profiles"), std::string::npos) << r.out;
  EXPECT_NE(ReadFile(dir_ + "/r.html").find("memory profile left out"), std::string::npos);
}

TEST_F(ReportCliTest, OutputItCannotWrite) {
  Result r = Cli(good_ + " -o " + dir_ + "/no/such/dir/r.html");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("cannot create"), std::string::npos) << r.out;
  // A symbolic link at the output's name is replaced, never written through.
  Write("target.txt", "keep");
  fs::create_symlink(dir_ + "/target.txt", dir_ + "/link.html");
  r = Cli(good_ + " -o " + dir_ + "/link.html");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(ReadFile(dir_ + "/target.txt"), "keep");
}

// Many threads: the page's summary keeps the busiest ones (the page builds a
// block per thread: 100k threads took 24.6 s to load) and says how many more.
TEST_F(ReportCliTest, ManyThreadsAreCappedAndCounted) {
  model::Space space;
  space.plane(model::kHostPlaneName);
  model::Plane& host = space.planes[0];
  uint32_t work = host.intern_event("work");
  for (int i = 1; i <= 300; ++i) {
    host.line_with_id(i).name = "t" + std::to_string(i);
    host.lines.back().events.push_back({0, 1'000'000 * i, work});
  }
  std::string many = dir_ + "/many.xplane.pb";
  ASSERT_TRUE(spyglass::exporter::WriteXSpaceFile(space, many).ok());
  Result r = Cli(many + " -o " + dir_ + "/r.html");
  ASSERT_EQ(r.code, 0) << r.out;
  std::string html = ReadFile(dir_ + "/r.html");
  size_t rows = 0;
  const std::string key = "\"busy_share\"";  // once per thread in the summary's JSON
  for (size_t at = html.find(key); at != std::string::npos; at = html.find(key, at + 1)) ++rows;
  EXPECT_EQ(rows, 20u);
  EXPECT_NE(html.find("\"threads_left_out\":280"), std::string::npos);
  EXPECT_NE(html.find("\"name\":\"t300\""), std::string::npos);  // the busiest
}

TEST_F(ReportCliTest, UsageErrors) {
  Result r = Cli(good_);  // no -o
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--output is required"), std::string::npos) << r.out;
}

}  // namespace
