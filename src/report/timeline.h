// The report's timeline: every thread (and GPU stream) of the model as lanes
// of non-overlapping spans (one lane per nesting depth), each lane stored at
// several levels of detail so that the browser never draws more spans than
// the canvas has pixels, whatever the zoom.
//
// Level 0 is the events themselves; level k merges neighbours of a lane
// closer than a threshold T_k (4^k * 16 ns) when one of them is shorter than
// T_k: drawn at T_k <= ns/pixel it looks the same as the events, with at most
// about two spans per pixel.
// A level is kept only if it halves the spans of the last kept one, so all
// levels together are at most twice the events.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "spyglass/status.h"


namespace spyglass::report {

// Whole spans of a streamed level, in order.
struct TimelineChunk {
  uint64_t offset = 0, bytes = 0;  // in the sink
  uint64_t first_span = 0;
  int64_t prev_ns = 0;  // the end of the span before it, in ns from its track's at_ns
};

struct TimelineLevel {
  int64_t threshold_ns = 0;  // 0: the events themselves
  uint64_t spans = 0;
  uint64_t offset = 0, bytes = 0;  // of its encoding in Timeline::blob
  // Lane levels of more than kChunkSpans spans: where span c * kChunkSpans
  // starts decoding, as pairs (byte from offset, the previous span's end in
  // ns from its track's at_ns): the page decodes only what is in view.
  std::vector<int64_t> marks;
  // A level streamed to a TimelineSink (TimelineBuilder::StreamTo): its
  // bytes there, in pieces (offset and bytes above then unused).
  std::vector<TimelineChunk> chunks;
};
inline constexpr uint64_t kChunkSpans = 8192;

inline constexpr size_t kStreamChunkBytes = 2048;

// Where a streamed timeline's lane levels go (spyglass view: a file it maps).
class TimelineSink {
 public:
  virtual ~TimelineSink() = default;
  // Keeps `bytes`; returns the offset of their first byte.
  virtual uint64_t Append(std::string_view bytes) = 0;
  // A sink that can give back what one Append kept (Read: `bytes` at
  // `offset` into `out`, false on failure) lets the builder make a level
  // only once it first differs from the one below (most are never kept).
  virtual bool Readable() const { return false; }
  virtual bool Read(uint64_t offset, uint64_t bytes, std::string* out) {
    (void)offset, (void)bytes, (void)out;
    return false;
  }
};

struct TimelineTrack {
  std::string plane, name;
  int64_t id = 0;     // the line's id (a thread id on host planes)
  int64_t at_ns = 0;  // where its first event starts, from Timeline::start_ns
  uint64_t events = 0;
  uint64_t hidden = 0;  // events deeper than kMaxLanes (not drawn, counted)
  std::vector<std::vector<TimelineLevel>> lanes;  // by depth, each finest level first
};

// A counter (an XSpace "_counters_" line: live bytes per device, GPU PM
// metrics) as a step series: level 0 is its samples, level k one point per
// 4^k * 16 ns bucket holding the bucket's lowest, highest and last value.
// A level is kept only if it halves the points of the last kept one.
struct TimelineCounter {
  std::string plane, name;
  bool bytes = false;  // the values are bytes
  int64_t at_ns = 0;   // its first sample, from Timeline::start_ns
  uint64_t samples = 0;
  double min = 0, max = 0;
  std::vector<TimelineLevel> levels;  // `spans` counts points
};

// An arrow between two events (a launch and its kernel: one correlation
// id): each end by its track (index in Timeline::tracks), lane and start
// (ns from Timeline::start_ns), which find it at any level of detail.
struct TimelineFlow {
  uint32_t from_track = 0, from_lane = 0;
  int64_t from_ns = 0;
  uint32_t to_track = 0, to_lane = 0;
  int64_t to_ns = 0;
};

struct Timeline {
  int64_t start_ns = 0;  // absolute time of 0 (the earliest event or sample)
  int64_t duration_ns = 0;
  uint64_t events = 0;
  std::vector<std::string> names;  // span name ids index this
  std::vector<uint64_t> name_events;  // events of each name (search counts)
  uint64_t hidden_names = 0;  // events named past kMaxNameBytes: under the last name
  // What the tooltip shows of an event ("batch=64, tf_op=train"): span
  // detail ids - 1 index this. Bounded: past kMaxDetails distinct strings
  // or kMaxDetailBytes in all, an event's detail is counted, not kept.
  std::vector<std::string> details;
  uint64_t hidden_details = 0;
  std::vector<TimelineTrack> tracks;
  uint64_t hidden_tracks = 0, hidden_track_events = 0;  // past kMaxTracks: the smallest, not shown
  std::vector<TimelineCounter> counters;  // in the order first seen
  std::vector<TimelineFlow> flows;  // by from_ns
  uint64_t hidden_flows = 0;        // past kMaxFlows, or with an end on a thread not shown
  // What CoarsenTimeline left out to fit the page's budget.
  uint64_t coarsened_lanes = 0, coarsened_events = 0, coarsened_counters = 0;
  int64_t coarsened_ns = 0;  // the finest detail left where some was dropped
  uint64_t hidden_counters = 0, hidden_counter_samples = 0;  // past kMaxCounters, and non-finite values
  // Each level: per span, as LEB128 varints, the zigzag gap from the end of
  // the previous span (the first: from its track's at_ns), the duration, the
  // name id, the detail id + 1 (0: none; merged spans have none) and
  // (levels > 0) the number of events merged; times in ns.
  // A counter level: per point, the zigzag varint gap from the previous
  // point (the first: from its at_ns), then its value as a little-endian
  // float64 (levels > 0: the lowest, the highest and the last).
  std::string blob;
};

inline constexpr size_t kMaxLanes = 128;
inline constexpr size_t kMaxTracks = 2000;
inline constexpr size_t kMaxCounters = 64;
inline constexpr size_t kMaxDetails = 65536, kMaxDetailBytes = 4 << 20, kMaxDetailLength = 256;
inline constexpr size_t kMaxNameLength = 1024;
inline constexpr size_t kMaxNameBytes = 4 << 20;  // all names together
inline constexpr size_t kMaxFlows = 50000;
inline constexpr size_t kMaxOpenFlows = 200000;  // ids waiting for their other end  // bytes of an event's name kept (cut at a character)

// Fed one line (thread, GPU stream) at a time, in any order; holds one
// line's events at a time besides the encoded levels.
class TimelineBuilder {
 public:
  // From now on lanes go to `sink` as their events come, each level in
  // chunks of about kStreamChunkBytes (TimelineLevel::chunks), not to the
  // blob: a line begun `sorted` (events by start, the longest first at one
  // start) is placed event by event and holds no spans (one out of order
  // is counted as hidden); other lines are held and sorted as without a sink.
  void StreamTo(TimelineSink* sink) { sink_ = sink; }
  void BeginLine(std::string_view plane, std::string_view line, int64_t id = 0, bool sorted = false);
  // `detail`: what the tooltip shows besides the name (cut to kMaxDetailLength).
  // `flow`: an id shared with the event at the other end of an arrow (a
  // correlation id; 0: none). `consumes`, `produces`: an async pair's ids
  // (an arrow from the producer to its consumer; one event may be both).
  void AddEvent(std::string_view name, int64_t start_ps, int64_t duration_ps, std::string_view detail = {},
                uint64_t flow = 0, uint64_t consumes = 0, uint64_t produces = 0);
  void EndLine();
  // One sample of the counter `name` on `plane` (any order; non-finite
  // values are counted and left out).
  void AddCounterSample(std::string_view plane, std::string_view name, int64_t time_ps, double value, bool bytes);
  // Host planes first, then devices (each plane's threads together, planes
  // in the order given), the busiest threads of a plane first.
  Timeline Finish();
  // Events of lines begun `sorted` that came out of order (counted as
  // hidden): a builder fed lines assumed sorted is rebuilt when any did.
  uint64_t out_of_order() const { return out_of_order_; }
  // Events added so far, the line being read included (a build's progress).
  uint64_t events_added() const { return tl_.events + (streaming_line_ ? track_.events : spans_.size()); }

 private:
  uint64_t out_of_order_ = 0;
  struct Span {
    int64_t start, end;  // ps
    uint32_t name;
    uint32_t count;   // events merged into it
    int64_t longest;  // duration of its longest event: that one names it
    uint32_t detail;  // id + 1 in Timeline::details (0: none)
    uint32_t links;   // index + 1 in links_ (0: none): few events have any
  };
  struct Links {
    uint64_t flow, consumes, produces;  // AddEvent's (0: none)
  };
  std::vector<Links> links_;  // of the line's held spans
  void AddFlowEnd(uint64_t flow, uint32_t lane, int64_t start_ps);
  static std::vector<Span> Merge(const std::vector<Span>& spans, int64_t threshold_ps);
  TimelineLevel Encode(const std::vector<Span>& spans, int64_t threshold_ns, int64_t base_ns);
  void AddLevels(const std::vector<Span>& lane, int64_t base_ns, std::vector<TimelineLevel>* levels);

  // The current line's placement: an event goes one lane below its
  // innermost open parent, or further down while that lane is busy.
  int Place(const Span& s, const Links* links);
  std::vector<int64_t> lane_end_;
  std::vector<std::pair<int64_t, size_t>> open_;  // (end, lane) of enclosing events
  TimelineTrack track_;

  // Streaming: each lane's levels made as its spans come, level k merging
  // the output of level k - 1 (as AddLevels); which are kept is decided
  // when the line ends.
  struct Stage {
    int64_t threshold_ns = 0;  // 0: the events
    // Nothing merged yet: its spans are the level below's (counted, not
    // encoded); encoded from that level's bytes at its first merge.
    bool lazy = false;
    bool has_pending = false;
    Span pending{};  // being merged
    uint64_t spans = 0;
    int64_t prev_end_ns = 0;  // absolute
    std::string buf;          // encoded, not yet in the sink
    uint64_t buf_first_span = 0;
    int64_t buf_prev_ns = 0;
    std::vector<TimelineChunk> chunks;
  };
  struct StreamLane {
    std::vector<Stage> stages;
    int64_t first_start = 0, last_end = 0;  // ps
  };
  void StreamSpan(const Span& s, const Links* links);
  void Feed(StreamLane& lane, size_t stage, const Span& s);
  void EncodeStaged(Stage& st, const Span& s);
  void EncodeNs(Stage& st, int64_t start, int64_t end, uint64_t name, uint64_t detail, uint64_t count);
  void Emit(Stage& st, const Span& s);
  void Materialize(StreamLane& lane, size_t stage);
  void FlushStage(Stage& st);
  void EndStreamedLine();
  TimelineSink* sink_ = nullptr;
  bool streaming_line_ = false;
  Span last_{};  // the previous event of a streamed line
  int64_t line_base_ns_ = 0;
  std::vector<StreamLane> stream_lanes_;

  Timeline tl_;
  std::vector<int64_t> base_ns_;  // of each track: absolute ns of its first event
  int64_t end_ps_ = INT64_MIN;
  // Looked up by string_view: no string made per event.
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, uint32_t, NameHash, std::equal_to<>> name_ids_;
  std::unordered_map<std::string, uint32_t, NameHash, std::equal_to<>> detail_ids_;  // id + 1
  size_t detail_bytes_ = 0;
  uint32_t DetailId(std::string_view detail);
  std::string plane_, line_;
  int64_t line_id_ = 0;
  std::vector<Span> spans_;
  size_t name_bytes_ = 0;
  uint32_t NameId(std::string_view name);
  struct RecentName {
    std::string name;
    uint32_t id = UINT32_MAX;
  };
  std::array<RecentName, 4> recent_names_;  // found last (AddEvent's first look)
  size_t next_recent_ = 0;
  struct FlowEnd {
    uint32_t track, lane;
    int64_t ns;  // absolute
  };
  std::unordered_map<uint64_t, FlowEnd> open_flows_;  // one end seen
  struct RawFlow {
    FlowEnd from, to;
  };
  std::vector<RawFlow> raw_flows_;
  std::vector<std::string> track_planes_;  // planes in the order first seen
  struct Sample {
    int64_t ps;
    double value;
  };
  std::vector<std::vector<Sample>> counter_samples_;  // by index in tl_.counters
  std::unordered_map<std::string, size_t> counter_index_;  // plane + '\0' + name
  void EncodeCounter(TimelineCounter& c, std::vector<Sample>& samples);
};

// Leaves out the finest levels of the lanes (and counters) that take the
// most bytes until the blob weighs at most `max_blob_bytes` (each keeps at
// least its coarsest level), and says so in the Timeline's coarsened_*.
// `cost`: what a level weighs (default: its bytes in the blob), e.g. its
// compressed size.
void CoarsenTimeline(Timeline* tl, uint64_t max_blob_bytes,
                     const std::function<uint64_t(const TimelineLevel&)>& cost = {});

// Adds the events and counters of one .xplane.pb (ours or JAX's) to
// `builder`; with `host`, its planes are named "<host> <plane>" (several
// hosts in one run). The CPU sampler's lines ("CPU samples") are added
// after the file's other lines, each sample named after its function
// (AddCpuSamples, cpu_samples.h: the streaming reader knows only their stack
// nodes' names, "cpu_stack#<n>"), or with `sample_lines` left out and counted
// there (the caller adds them with AddCpuSamples, with their stacks).
// `unsorted` (optional): the lines (plane index in the file, line index in
// its plane) whose events are out of order (FindUnsortedLines); the others
// are begun sorted, so that a streaming builder holds none of their spans.
// `progress`: called now and then with (bytes read, file size).
Status AddProfileFile(const std::string& path, const std::string& host, TimelineBuilder* builder,
                      uint64_t* sample_lines = nullptr,
                      const std::set<std::pair<size_t, size_t>>* unsorted = nullptr,
                      const std::function<void(uint64_t, uint64_t)>& progress = {});
// One pass over the file: the lines whose events do not come by start (the
// longest first at one start), as TimelineBuilder places them.
Status FindUnsortedLines(const std::string& path, std::set<std::pair<size_t, size_t>>* unsorted);

}  // namespace spyglass::report
