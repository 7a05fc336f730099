#include "export/perfetto/perfetto_writer.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "export/join_workers.h"
#include "export/output_file.h"
#include "model/schema.h"
#include "sampling/cpu_model.h"

namespace spyglass::exporter {
namespace {

// A hand-written encoder of the few fields written (their numbers are wire
// facts, spec PERFETTO.md) instead of Perfetto's protos: the amalgamated
// perfetto_trace.proto is 680 KB of someone else's schema to vendor and
// compile for some thirty fields, and generated classes would build each
// packet as an object before serializing it. Writing the bytes directly is
// what keeps this writer ahead of trace.json.gz (BENCHMARKS.md); the varints
// are model/wire.h's encoding, written through a pointer into a reused
// buffer rather than appended to a std::string byte by byte. The tests
// decode the output with the Perfetto project's own classes (PyPI perfetto),
// so a wrong number or wire type here shows there.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kBytes = 2;

// Trace
constexpr uint32_t kTracePacket = 1;
// TracePacket
constexpr uint32_t kPacketTimestamp = 8, kPacketSequenceId = 10, kPacketTrackEvent = 11, kPacketInternedData = 12,
                   kPacketSequenceFlags = 13, kPacketTraceStats = 35, kPacketTrackDescriptor = 60,
                   kPacketPerfSample = 66, kPacketFirstOnSequence = 87;
constexpr uint32_t kSeqIncrementalStateCleared = 1, kSeqNeedsIncrementalState = 2;
// TrackEvent
constexpr uint32_t kEventDebugAnnotations = 4, kEventType = 9, kEventNameIid = 10, kEventTrackUuid = 11,
                   kEventCounterValue = 30, kEventDoubleCounterValue = 44, kEventFlowIds = 47;
constexpr uint8_t kTypeSliceBegin = 1, kTypeSliceEnd = 2, kTypeInstant = 3, kTypeCounter = 4;
// InternedData and its entries (EventName, DebugAnnotationName, InternedString: iid 1, name 2)
constexpr uint32_t kInternedEventNames = 2, kInternedDebugAnnotationNames = 3, kInternedFunctionNames = 5,
                   kInternedFrames = 6, kInternedCallstacks = 7, kInternedMappingPaths = 17, kInternedSourcePaths = 18,
                   kInternedMappings = 19, kEntryIid = 1, kEntryName = 2;
// Mapping, Frame, Callstack (profile_common.proto)
constexpr uint32_t kMappingPathIds = 7;
constexpr uint32_t kFrameFunctionNameId = 2, kFrameMappingId = 3, kFrameRelPc = 4, kFrameSourcePathIid = 5,
                   kFrameLineNumber = 6, kFrameKind = 7;
constexpr uint32_t kFrameKindNative = 1, kFrameKindInterpreted = 3;
constexpr uint32_t kCallstackFrameIds = 2;
// PerfSample; Profiling.CpuMode
constexpr uint32_t kSamplePid = 2, kSampleTid = 3, kSampleCallstackIid = 4, kSampleCpuMode = 5;
constexpr uint32_t kCpuModeUser = 2;
// DebugAnnotation
constexpr uint32_t kAnnotationNameIid = 1, kAnnotationUint = 3, kAnnotationInt = 4, kAnnotationDouble = 5,
                   kAnnotationString = 6;
// TrackDescriptor, ProcessDescriptor, ThreadDescriptor, CounterDescriptor
constexpr uint32_t kTrackUuid = 1, kTrackName = 2, kTrackProcess = 3, kTrackThread = 4, kTrackParentUuid = 5,
                   kTrackCounter = 8;
constexpr uint32_t kProcessPid = 1, kProcessName = 6, kProcessLabels = 8;
constexpr uint32_t kThreadPid = 1, kThreadTid = 2, kThreadName = 5;
constexpr uint32_t kCounterUnit = 3, kUnitSizeBytes = 3;
// TraceStats.buffer_stats, BufferStats.trace_writer_packet_loss
constexpr uint32_t kStatsBufferStats = 1, kBufferPacketLoss = 19;

// One writer sequence for the whole file: interned names are defined once
// (one generation, cleared at the first packet only, as a writer that never
// loses data may do). Small and non-zero: one byte a packet.
constexpr uint32_t kSequenceId = 1;
// The CPU sampler's samples (PerfSample packets) on a sequence of their own:
// their frames and callstacks are interned there, once, in the head.
constexpr uint32_t kSampleSequenceId = 2;
// The two mappings frames point to (the model keeps no module per frame):
// trace_processor drops a frame whose mapping is not interned.
constexpr uint64_t kNativeMappingIid = 1, kPythonMappingIid = 2;
// A sample's open annotations are the outermost frames of its callstack, in
// a mapping of their own, so that a flame graph of a range groups by them.
constexpr uint64_t kAnnotationMappingIid = 3;
constexpr size_t kMaxNameParts = 8;  // "a::b::..." parts an annotation's own name may hold
// A stack longer than this (a cycle of callers in a hostile model) is cut.
constexpr size_t kMaxStackDepth = 4096;
constexpr int64_t kDevicePidBase = 0x40000000;
constexpr int64_t kHostPidFallback = 701;  // the host plane's pid in the trace JSON

// Lines whose events overlap without nesting get at most this many tracks;
// past it (hostile input) the rest share the last one.
constexpr size_t kMaxLanes = 64;
// Events per slice of work: about 1 MiB of output.
constexpr size_t kSliceEvents = 1 << 15;
// Interned names per packet of the head.
constexpr size_t kNamesPerPacket = 1024;

inline size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

inline uint8_t* PutVarint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

// A growing buffer of packets. Nested messages get a one-byte length when
// opened, widened in place when they close longer (rare: a long name or many
// args), so a packet is written once, front to back.
class Out {
 public:
  // Room for `k` more bytes; the caller writes there and calls Commit.
  uint8_t* Room(size_t k) {
    if (buf_.size() - n_ < k) buf_.resize(std::max(buf_.size() * 2, n_ + k + 4096));
    return buf_.data() + n_;
  }
  void Commit(uint8_t* end) { n_ = static_cast<size_t>(end - buf_.data()); }

  void Varint(uint64_t v) { Commit(PutVarint(Room(10), v)); }
  void Key(uint32_t number, uint32_t type) { Varint((uint64_t{number} << 3) | type); }
  void VarintField(uint32_t number, uint64_t v) {
    Key(number, kVarint);
    Varint(v);
  }
  void Fixed64Field(uint32_t number, uint64_t v) {
    Key(number, kFixed64);
    uint8_t* p = Room(8);
    for (int i = 0; i < 8; ++i) *p++ = static_cast<uint8_t>(v >> (8 * i));  // little-endian on the wire
    Commit(p);
  }
  void DoubleField(uint32_t number, double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    Fixed64Field(number, bits);
  }
  void BytesField(uint32_t number, std::string_view s) {
    Key(number, kBytes);
    Varint(s.size());
    uint8_t* p = Room(s.size());
    if (!s.empty()) std::memcpy(p, s.data(), s.size());
    Commit(p + s.size());
  }
  // Opens a length-delimited field; returns what Close takes.
  size_t Open(uint32_t number) {
    Key(number, kBytes);
    uint8_t* p = Room(1);
    *p = 0;
    Commit(p + 1);
    return n_ - 1;
  }
  void Close(size_t at) {
    const size_t len = n_ - at - 1;
    if (len < 0x80) {
      buf_[at] = static_cast<uint8_t>(len);
      return;
    }
    const size_t width = VarintSize(len);
    Room(width - 1);
    std::memmove(buf_.data() + at + width, buf_.data() + at + 1, len);
    PutVarint(buf_.data() + at, len);
    n_ += width - 1;
  }

  std::string_view view() const { return {reinterpret_cast<const char*>(buf_.data()), n_}; }
  size_t size() const { return n_; }
  void clear() { n_ = 0; }

 private:
  std::vector<uint8_t> buf_ = std::vector<uint8_t>(kSliceEvents * 48);
  size_t n_ = 0;
};

// Stats the trace JSON hides too (tsl's exporter treats them as internal);
// _p/_pt/_c/_ct become flows instead.
bool IsInternalStat(std::string_view name) {
  return name == "_r" || name == "_p" || name == "_pt" || name == "_c" || name == "_ct" || name == "flops" ||
         name == "program_id" || name == "symbol_id";
}

// A flow id from its parts: trace-global, so the process is part of it; never 0.
uint64_t FlowId(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
  h = (h ^ (h >> 31)) * 0xBF58476D1CE4E5B9ull ^ c;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  return h == 0 ? 1 : h;
}

bool IsInt(const model::Stat& s) { return s.kind == model::StatKind::kInt64 || s.kind == model::StatKind::kUint64; }
int64_t IntOf(const model::Stat& s) { return s.kind == model::StatKind::kUint64 ? static_cast<int64_t>(s.u64) : s.i64; }

// The process a plane was recorded in (its process_id stat), 0 if none.
int64_t ProcessIdOf(const model::Plane& p) {
  for (const model::Stat& s : p.stats)
    if (IsInt(s) && p.stat_name(s) == model::kProcessIdStat) return IntOf(s);
  return 0;
}

bool IsHostPlane(const model::Plane& p) {
  return p.name == model::kHostPlaneName || p.name.rfind(model::kMergedHostPlanePrefix, 0) == 0;
}

// A line's time plus an offset as nanoseconds on the trace's clock: floor of
// the picoseconds (so that nesting in ps stays nesting in ns), saturated,
// and never below 0 (trace_processor drops negative timestamps).
uint64_t NsAt(int64_t base_ns, int64_t offset_ps) {
  int64_t q = offset_ps / 1000;
  if (offset_ps % 1000 < 0) --q;
  int64_t ns;
  if (__builtin_add_overflow(base_ns, q, &ns)) ns = q < 0 ? INT64_MIN : INT64_MAX;
  return ns < 0 ? 0 : static_cast<uint64_t>(ns);
}

int64_t EndPs(const model::Event& e) {
  int64_t end;
  if (__builtin_add_overflow(e.offset_ps, std::max<int64_t>(e.duration_ps, 0), &end)) end = INT64_MAX;
  return end;
}

// What every slice of the trace reads, computed once, before any byte is
// written: pids, track uuids, where names are interned, and per line the
// order of its events and the track each one goes on.
//
// Each event is written as its BEGIN packet directly followed by its END
// packet (a complete event), with no stack of open slices: trace_processor
// sorts all events by time before it nests them, keeping file order at equal
// times, and an END carries no name, so ENDs at one time are interchangeable.
// With events in (start, longest first) order, every END(t) precedes in the
// file each later-starting BEGIN(t), which is what nesting needs. This makes
// slices of a line independent of each other: they are encoded in parallel.
struct Doc {
  struct LineInfo {
    const model::Line* line = nullptr;
    bool counters = false;
    std::vector<uint32_t> order;        // the events in (start, longest first) order; empty: already so
    std::vector<uint8_t> lane;          // by position in that order; empty: all on the thread's track
    std::vector<uint64_t> lane_uuids;   // [0]: the thread's track; then tracks beside it
    // A line of CPU samples (sampling/cpu_model.h): PerfSample packets on the
    // thread `tid`, not slices; a thread track of its own (for the thread's
    // name) only when no other line of the plane is that thread.
    bool samples = false;
    uint32_t tid = 0;
  };
  // A CPU stack node (an event metadata id) that samples reach.
  struct StackNode {
    uint32_t parent = 0;  // the caller's node; 0: outermost
    uint32_t file = 0;    // stat metadata id naming its source file; 0: none
    int64_t line = 0;
    uint64_t address = 0;
    bool python = false;
    bool used = false;  // on some sample's stack
    bool leaf = false;  // some sample's innermost node
  };
  struct PlaneInfo {
    const model::Plane* plane = nullptr;
    int64_t pid = 0;
    int64_t os_pid = 0;  // the recorded process (flows are per process)
    uint64_t uuid = 0;   // the process track
    uint64_t name_base = 0, stat_base = 0;  // iid = base + metadata id
    std::vector<uint8_t> internal;          // by stat metadata id
    uint32_t correlation = 0, producer = 0, producer_type = 0, consumer = 0, consumer_type = 0;
    bool has_flow_stats = false;
    std::vector<LineInfo> lines;
    // (event, stat metadata id) of the counter line's values -> track uuid, in first-seen order.
    std::vector<std::pair<uint64_t, uint64_t>> counter_tracks;
    std::unordered_map<uint64_t, uint64_t> counter_uuid;
    // By event metadata id; empty without CPU samples.
    std::vector<StackNode> nodes;
    // Samples with an annotation stack (stat annotation_stack, a ref): their
    // callstack, by (innermost node << 32 | the ref); the callstack's iid is
    // Doc::extra_iid_base + its index in annotated.
    struct AnnotatedStack {
      uint32_t leaf = 0;
      std::vector<uint32_t> annotations;  // indices into Doc::annotation_names, outermost first
    };
    uint32_t annotation_key = 0;  // the annotation_stack stat's metadata id; 0: none
    std::unordered_map<uint64_t, uint64_t> annotated_index;
    std::vector<AnnotatedStack> annotated;
  };
  std::vector<PlaneInfo> planes;
  uint64_t start_ns = 0;  // the earliest event: the descriptors' time
  uint64_t lost = 0;      // events the recorder dropped or overwrote
  bool any_samples = false;
  // Annotation frames (one per distinct annotation name, its function name
  // and frame iid extra_iid_base + index) and annotated callstacks (iid
  // extra_iid_base + their index over all planes): past every event
  // metadata's iid.
  std::vector<std::string> annotation_names;
  std::unordered_map<std::string, uint32_t> annotation_ids;
  uint64_t annotated_count = 0;
  uint64_t extra_iid_base = 0;

  explicit Doc(const model::Space& space) {
    uint64_t names = 1, stats = 1;  // iids start at 1: 0 never resolves
    uint64_t next_uuid = 1;  // small uuids cost one or two bytes an event; unique in the file
    for (const model::Plane& p : space.planes) {
      bool any = false;
      for (const model::Line& l : p.lines) any = any || !l.events.empty();
      if (!any) continue;  // /host:metadata, Task Environment, empty devices
      PlaneInfo& info = planes.emplace_back();
      info.plane = &p;
      info.uuid = next_uuid++;
      info.name_base = names;
      info.stat_base = stats;
      names += p.event_metadata().size();
      stats += p.stat_metadata().size();
      info.internal.resize(p.stat_metadata().size());
      for (size_t i = 1; i < p.stat_metadata().size(); ++i) {
        const std::string& n = p.stat_metadata()[i].name;
        const auto id = static_cast<uint32_t>(i);
        info.internal[i] = IsInternalStat(n);
        if (n == model::kCorrelationIdStat) info.correlation = id;
        else if (n == "_p") info.producer = id;
        else if (n == "_pt") info.producer_type = id;
        else if (n == "_c") info.consumer = id;
        else if (n == "_ct") info.consumer_type = id;
      }
      info.has_flow_stats = (info.correlation | info.producer | info.consumer) != 0;
      for (const model::Stat& s : p.stats) {
        const std::string& n = p.stat_name(s);
        if ((n == model::kDroppedEventsStat || n == model::kOverwrittenEventsStat ||
             n == model::kDroppedOverSizeLimitStat) && IsInt(s) && IntOf(s) > 0)
          lost += static_cast<uint64_t>(IntOf(s));
      }
      for (const model::Line& l : p.lines) {
        if (l.events.empty()) continue;
        LineInfo& li = info.lines.emplace_back();
        li.line = &l;
        li.counters = l.name == model::kCounterLineName;
        li.samples = l.name == sampling::kCpuSamplesLineName;
        if (li.samples) {
          li.tid = static_cast<uint32_t>(l.display_id ? l.display_id : l.id);  // as a thread's track (Track)
        } else if (li.counters) {
          for (const model::Event& e : l.events)
            for (const model::Stat& s : l.stats_of(e)) {
              if (!IsInt(s) && s.kind != model::StatKind::kDouble) continue;
              const uint64_t key = (uint64_t{e.metadata_id} << 32) | s.metadata_id;
              if (info.counter_uuid.emplace(key, next_uuid).second) info.counter_tracks.emplace_back(key, next_uuid++);
            }
        } else {
          Lanes(li);
          for (size_t k = 0; k < li.lane_uuids.size(); ++k) li.lane_uuids[k] = next_uuid++;
        }
        int64_t min_ps = INT64_MAX;
        for (const model::Event& e : l.events) min_ps = std::min(min_ps, e.offset_ps);
        first_ = std::min(first_, NsAt(l.timestamp_ns, min_ps));
      }
      bool samples = false;
      std::unordered_set<uint32_t> thread_tids;  // threads with a track already
      for (const LineInfo& li : info.lines)
        if (!li.samples && !li.counters)
          thread_tids.insert(static_cast<uint32_t>(li.line->display_id ? li.line->display_id : li.line->id));
      for (LineInfo& li : info.lines) {
        if (!li.samples) continue;
        samples = true;
        if (thread_tids.insert(li.tid).second) li.lane_uuids.push_back(next_uuid++);
      }
      if (samples) {
        StackNodes(info);
        AnnotatedStacks(info);
      }
      any_samples = any_samples || samples;
    }
    extra_iid_base = names;
    start_ns = first_ == UINT64_MAX ? 0 : first_;
    AssignPids();
  }

 private:
  // The order of a line's events and the track of each: the thread's, or
  // for one that overlaps an open slice without nesting in it, the first
  // track beside it where it nests.
  static void Lanes(LineInfo& li) {
    const std::vector<model::Event>& events = li.line->events;
    const auto before = [](const model::Event& a, const model::Event& b) {
      return a.offset_ps != b.offset_ps ? a.offset_ps < b.offset_ps : a.duration_ps > b.duration_ps;
    };
    if (!std::is_sorted(events.begin(), events.end(), before)) {
      li.order.resize(events.size());
      std::iota(li.order.begin(), li.order.end(), 0u);
      std::stable_sort(li.order.begin(), li.order.end(),
                       [&](uint32_t a, uint32_t b) { return before(events[a], events[b]); });
    }
    std::vector<std::vector<int64_t>> open(1);  // per track: the ends of its open slices
    for (size_t i = 0; i < events.size(); ++i) {
      const model::Event& e = events[li.order.empty() ? i : li.order[i]];
      const int64_t end = EndPs(e);
      size_t k = 0;
      for (;; ++k) {
        if (k == open.size()) {
          if (k == kMaxLanes) {
            k = kMaxLanes - 1;
            break;
          }
          open.emplace_back();
        }
        std::vector<int64_t>& ends = open[k];
        while (!ends.empty() && ends.back() <= e.offset_ps) ends.pop_back();
        if (ends.empty() || ends.back() >= end) break;
      }
      open[k].push_back(end);
      if (k > 0 && li.lane.empty()) li.lane.assign(events.size(), 0);
      if (!li.lane.empty()) li.lane[i] = static_cast<uint8_t>(k);
    }
    li.lane_uuids.resize(open.size());
  }

  // The nodes the samples' stacks reach, from each sample's innermost node
  // up its callers (cpu_stack_parent) to one already reached: stacks share
  // their outer nodes, so each node is read once.
  static void StackNodes(PlaneInfo& info) {
    const model::Plane& p = *info.plane;
    constexpr uint32_t kAbsent = UINT32_MAX;
    uint32_t parent_key = kAbsent, file_key = kAbsent, line_key = kAbsent, address_key = kAbsent,
             kind_key = kAbsent;
    for (size_t i = 1; i < p.stat_metadata().size(); ++i) {
      const std::string& n = p.stat_metadata()[i].name;
      const auto id = static_cast<uint32_t>(i);
      if (n == sampling::kCpuParentStat) parent_key = id;
      else if (n == sampling::kCpuFileStat) file_key = id;
      else if (n == sampling::kCpuLineStat) line_key = id;
      else if (n == sampling::kCpuAddressStat) address_key = id;
      else if (n == sampling::kCpuFrameKindStat) kind_key = id;
    }
    const size_t n = p.event_metadata().size();
    info.nodes.resize(n);
    for (const LineInfo& li : info.lines) {
      if (!li.samples) continue;
      for (const model::Event& e : li.line->events) {
        uint32_t id = e.metadata_id;
        if (id == 0 || id >= n) continue;
        info.nodes[id].leaf = true;
        for (size_t depth = 0; id != 0 && !info.nodes[id].used && depth < kMaxStackDepth; ++depth) {
          StackNode& node = info.nodes[id];
          node.used = true;
          for (const model::Stat& s : p.event_metadata()[id].stats) {
            if (s.metadata_id == parent_key && IsInt(s)) {
              const auto v = static_cast<uint64_t>(IntOf(s));
              node.parent = v < n && v != id ? static_cast<uint32_t>(v) : 0;
            } else if (s.metadata_id == file_key && s.kind == model::StatKind::kRef && s.ref != 0 &&
                       s.ref < p.stat_metadata().size()) {
              node.file = static_cast<uint32_t>(s.ref);
            } else if (s.metadata_id == line_key && IsInt(s)) {
              node.line = IntOf(s);
            } else if (s.metadata_id == address_key && IsInt(s)) {
              node.address = static_cast<uint64_t>(IntOf(s));
            } else if (s.metadata_id == kind_key && s.kind == model::StatKind::kRef) {
              node.python = s.ref < p.stat_metadata().size() && p.stat_metadata()[s.ref].name == "python";
            }
          }
          id = node.parent;
        }
      }
    }
  }

  // The annotation stacks of the samples ("outer::inner", the model's
  // annotation_stack stat), cut into annotations. An annotation's own name
  // may hold "::" (a C++ name): runs of parts that join into the name of an
  // event of the plane are one annotation (the longest such run, of at most
  // kMaxNameParts parts).
  void AnnotatedStacks(PlaneInfo& info) {
    const model::Plane& p = *info.plane;
    for (size_t i = 1; i < p.stat_metadata().size(); ++i)
      if (p.stat_metadata()[i].name == model::kAnnotationStackStat) info.annotation_key = static_cast<uint32_t>(i);
    if (info.annotation_key == 0) return;
    std::unordered_set<std::string_view> known;
    for (size_t i = 1; i < p.event_metadata().size(); ++i) {
      const model::EventMetadata& md = p.event_metadata()[i];
      if (md.name.starts_with(sampling::kCpuStackNodePrefix)) continue;  // stack frames are not annotations
      if (md.name.find("::") != std::string::npos) known.insert(md.name);
      if (md.display_name.find("::") != std::string::npos) known.insert(md.display_name);
    }
    std::vector<std::string_view> parts;
    for (const LineInfo& li : info.lines) {
      if (!li.samples) continue;
      for (const model::Event& e : li.line->events) {
        if (e.metadata_id == 0 || e.metadata_id >= info.nodes.size()) continue;
        for (const model::Stat& s : li.line->stats_of(e)) {
          if (s.metadata_id != info.annotation_key || s.kind != model::StatKind::kRef || s.ref == 0 ||
              s.ref >= p.stat_metadata().size())
            continue;
          const uint64_t key = (uint64_t{e.metadata_id} << 32) | s.ref;
          if (info.annotated_index.count(key)) continue;
          const std::string_view text = p.stat_metadata()[s.ref].name;
          parts.clear();
          for (size_t at = 0;;) {
            const size_t sep = text.find("::", at);
            parts.push_back(text.substr(at, sep == std::string_view::npos ? std::string_view::npos : sep - at));
            if (sep == std::string_view::npos) break;
            at = sep + 2;
          }
          PlaneInfo::AnnotatedStack stack;
          stack.leaf = e.metadata_id;
          for (size_t k = 0; k < parts.size() && stack.annotations.size() < kMaxStackDepth;) {
            size_t take = 1;
            if (!known.empty())  // a name of at most kMaxNameParts parts (bounded work on a hostile stack)
              for (size_t m = std::min(parts.size(), k + kMaxNameParts); m > k + 1; --m) {
                const char* b = parts[k].data();
                const std::string_view joined(b, static_cast<size_t>(parts[m - 1].data() + parts[m - 1].size() - b));
                if (known.count(joined)) {
                  take = m - k;
                  break;
                }
              }
            const char* b = parts[k].data();
            const std::string name(b, static_cast<size_t>(parts[k + take - 1].data() + parts[k + take - 1].size() - b));
            auto [it, fresh] = annotation_ids.emplace(name, static_cast<uint32_t>(annotation_names.size()));
            if (fresh) annotation_names.push_back(name);
            stack.annotations.push_back(it->second);
            k += take;
          }
          info.annotated_index.emplace(key, annotated_count++);
          info.annotated.push_back(std::move(stack));
        }
      }
    }
  }

  // Host planes: the recorded pid. Device planes have no process of their
  // own: their pids start above any real one (Linux's pid_max is at most
  // 2^22), so that a profiled pid 1 (a container's) never shares its process
  // with GPU 0.
  void AssignPids() {
    std::vector<int64_t> used;
    int64_t device = 0;
    for (PlaneInfo& info : planes) {
      info.os_pid = ProcessIdOf(*info.plane);
      int64_t pid = 0;
      if (IsHostPlane(*info.plane)) pid = info.os_pid > 0 ? info.os_pid : kHostPidFallback;
      if (pid <= 0 || pid > INT32_MAX || std::find(used.begin(), used.end(), pid) != used.end())
        pid = kDevicePidBase + device++;
      used.push_back(pid);
      info.pid = pid;
    }
  }

  uint64_t first_ = UINT64_MAX;
};

// Interned entries of one sequence, kNamesPerPacket to a packet.
class InternedPackets {
 public:
  InternedPackets(Out& o, uint64_t ts, uint32_t sequence) : o_(o), ts_(ts), sequence_(sequence) {}
  ~InternedPackets() { Flush(); }
  // Opens an entry of `table` (an InternedData field); its fields follow; then End.
  size_t Begin(uint32_t table) {
    if (in_packet_ == 0) {
      packet_ = o_.Open(kTracePacket);
      o_.VarintField(kPacketTimestamp, ts_);
      o_.VarintField(kPacketSequenceId, sequence_);
      data_ = o_.Open(kPacketInternedData);
    }
    return o_.Open(table);
  }
  void End(size_t entry) {
    o_.Close(entry);
    if (++in_packet_ == kNamesPerPacket) Flush();
  }
  // An entry of {iid, name}: EventName, DebugAnnotationName, InternedString.
  void Name(uint32_t table, uint64_t iid, std::string_view name) {
    const size_t e = Begin(table);
    o_.VarintField(kEntryIid, iid);
    o_.BytesField(kEntryName, name);
    End(e);
  }
  void Flush() {
    if (in_packet_ == 0) return;
    o_.Close(data_);
    o_.Close(packet_);
    in_packet_ = 0;
  }

 private:
  Out& o_;
  const uint64_t ts_;
  const uint32_t sequence_;
  size_t in_packet_ = 0, packet_ = 0, data_ = 0;
};

// A slice of the trace that encodes on its own: the head (state, names,
// tracks), events [begin, end) of one line (in its order), or the tail.
struct Slice {
  enum Kind : uint8_t { kHead, kEvents, kTail };
  Kind kind = kHead;
  uint32_t plane = 0, line = 0;
  size_t begin = 0, end = 0;
};

template <class Emit>
void ForEachSlice(const Doc& doc, Emit&& emit) {
  if (!emit(Slice{Slice::kHead})) return;
  for (uint32_t pi = 0; pi < doc.planes.size(); ++pi)
    for (uint32_t li = 0; li < doc.planes[pi].lines.size(); ++li) {
      const size_t n = doc.planes[pi].lines[li].line->events.size();
      for (size_t b = 0; b < n; b += kSliceEvents)
        if (!emit(Slice{Slice::kEvents, pi, li, b, std::min(n, b + kSliceEvents)})) return;
    }
  emit(Slice{Slice::kTail});
}

class Encoder {
 public:
  Encoder(const Doc& doc, Out& out) : doc_(doc), o_(out) {}

  void Encode(const Slice& slice) {
    switch (slice.kind) {
      case Slice::kHead: Head(); break;
      case Slice::kEvents: {
        const Doc::PlaneInfo& info = doc_.planes[slice.plane];
        const Doc::LineInfo& li = info.lines[slice.line];
        if (li.counters) Counters(info, *li.line, slice.begin, slice.end);
        else if (li.samples) Samples(info, li, slice.begin, slice.end);
        else Events(info, li, slice.begin, slice.end);
        break;
      }
      case Slice::kTail: Tail(); break;
    }
  }

 private:
  size_t BeginPacket(uint64_t ts, uint32_t sequence = kSequenceId) {
    size_t pk = o_.Open(kTracePacket);
    o_.VarintField(kPacketTimestamp, ts);
    o_.VarintField(kPacketSequenceId, sequence);
    return pk;
  }

  // The sequence's state, cleared at its first packet (only then does
  // trace_processor accept interned data), every name, every track.
  void Head() {
    size_t pk = BeginPacket(doc_.start_ns);
    o_.VarintField(kPacketSequenceFlags, kSeqIncrementalStateCleared);
    o_.VarintField(kPacketFirstOnSequence, 1);
    o_.Close(pk);
    // Names once, up front (one generation for the whole file, as a writer
    // that never loses data may keep): no event needs to check whether its
    // names were sent, so slices of events are independent.
    {
      InternedPackets names(o_, doc_.start_ns, kSequenceId);
      for (const Doc::PlaneInfo& info : doc_.planes) {
        const model::Plane& p = *info.plane;
        for (size_t i = 1; i < p.event_metadata().size(); ++i) {
          const model::EventMetadata& md = p.event_metadata()[i];
          names.Name(kInternedEventNames, info.name_base + i, md.display_name.empty() ? md.name : md.display_name);
        }
        for (size_t i = 1; i < p.stat_metadata().size(); ++i)
          if (!info.internal[i]) names.Name(kInternedDebugAnnotationNames, info.stat_base + i, p.stat_metadata()[i].name);
      }
    }
    for (const Doc::PlaneInfo& info : doc_.planes) {
      Process(info);
      for (const Doc::LineInfo& li : info.lines) {
        if (li.counters) continue;
        const model::Line& l = *li.line;
        if (li.samples) {
          if (!li.lane_uuids.empty()) Track(Kind::kThread, li.lane_uuids[0], 0, &l, info.pid, SampledThreadName(l));
          continue;
        }
        const std::string& name = l.display_name.empty() ? l.name : l.display_name;
        Track(Kind::kThread, li.lane_uuids[0], 0, &l, info.pid, name);
        for (size_t k = 1; k < li.lane_uuids.size(); ++k)
          Track(Kind::kLane, li.lane_uuids[k], li.lane_uuids[0], &l, info.pid, name);
      }
      for (const auto& [key, uuid] : info.counter_tracks) {
        const model::Plane& p = *info.plane;
        const model::EventMetadata& md = p.event_metadata()[key >> 32];
        const std::string& event_name = md.display_name.empty() ? md.name : md.display_name;
        const std::string& stat_name = p.stat_metadata()[key & 0xffffffff].name;
        const bool bytes = stat_name == model::kLiveBytesStat;
        // "memory cpu" (its one value: live bytes), a PM metric (named as
        // its stat); otherwise "<event> <stat>" as Perfetto names JSON counters.
        const std::string track = bytes || stat_name == event_name ? event_name : event_name + " " + stat_name;
        Track(bytes ? Kind::kBytesCounter : Kind::kCounter, uuid, info.uuid, nullptr, 0, track);
      }
    }
    SampleHead();
  }

  // The samples' sequence: its state, then every function, source file,
  // frame (one per stack node: iid = the node's name iid) and callstack (one
  // per innermost node of a sample: its frames outermost first, as Callstack
  // wants).
  void SampleHead() {
    if (!doc_.any_samples) return;
    size_t pk = BeginPacket(doc_.start_ns, kSampleSequenceId);
    o_.VarintField(kPacketSequenceFlags, kSeqIncrementalStateCleared);
    o_.VarintField(kPacketFirstOnSequence, 1);
    o_.Close(pk);
    InternedPackets in(o_, doc_.start_ns, kSampleSequenceId);
    for (auto [iid, path] : {std::pair{kNativeMappingIid, "[native]"}, std::pair{kPythonMappingIid, "[python]"},
                             std::pair{kAnnotationMappingIid, "[annotation]"}}) {
      in.Name(kInternedMappingPaths, iid, path);
      const size_t m = in.Begin(kInternedMappings);
      o_.VarintField(kEntryIid, iid);
      o_.VarintField(kMappingPathIds, iid);
      in.End(m);
    }
    std::vector<uint32_t> stack;
    for (const Doc::PlaneInfo& info : doc_.planes) {
      if (info.nodes.empty()) continue;
      const model::Plane& p = *info.plane;
      std::vector<bool> file_sent(p.stat_metadata().size());
      for (size_t i = 1; i < info.nodes.size(); ++i) {
        const Doc::StackNode& node = info.nodes[i];
        if (!node.used) continue;
        const model::EventMetadata& md = p.event_metadata()[i];
        in.Name(kInternedFunctionNames, info.name_base + i, md.display_name.empty() ? md.name : md.display_name);
        if (node.file != 0 && !file_sent[node.file]) {
          file_sent[node.file] = true;
          in.Name(kInternedSourcePaths, info.stat_base + node.file, p.stat_metadata()[node.file].name);
        }
        const size_t f = in.Begin(kInternedFrames);
        o_.VarintField(kEntryIid, info.name_base + i);
        o_.VarintField(kFrameFunctionNameId, info.name_base + i);
        o_.VarintField(kFrameMappingId, node.python ? kPythonMappingIid : kNativeMappingIid);
        if (node.address != 0) o_.VarintField(kFrameRelPc, node.address);
        if (node.file != 0) o_.VarintField(kFrameSourcePathIid, info.stat_base + node.file);
        if (node.line > 0 && node.line <= UINT32_MAX) o_.VarintField(kFrameLineNumber, static_cast<uint64_t>(node.line));
        o_.VarintField(kFrameKind, node.python ? kFrameKindInterpreted : kFrameKindNative);
        in.End(f);
      }
      for (size_t i = 1; i < info.nodes.size(); ++i) {
        if (!info.nodes[i].leaf) continue;
        stack.clear();
        for (uint32_t id = static_cast<uint32_t>(i); id != 0 && stack.size() < kMaxStackDepth;
             id = info.nodes[id].parent)
          stack.push_back(id);
        const size_t c = in.Begin(kInternedCallstacks);
        o_.VarintField(kEntryIid, info.name_base + i);
        // Not packed: the field is proto2 without [packed=true], and
        // trace_processor's decoder reads it so.
        for (size_t k = stack.size(); k-- > 0;) o_.VarintField(kCallstackFrameIds, info.name_base + stack[k]);
        in.End(c);
      }
    }
    // The annotations' frames, then the annotated callstacks: the sample's
    // annotations outermost first, then its stack.
    for (size_t k = 0; k < doc_.annotation_names.size(); ++k) {
      const uint64_t iid = doc_.extra_iid_base + k;
      in.Name(kInternedFunctionNames, iid, doc_.annotation_names[k]);
      const size_t f = in.Begin(kInternedFrames);
      o_.VarintField(kEntryIid, iid);
      o_.VarintField(kFrameFunctionNameId, iid);
      o_.VarintField(kFrameMappingId, kAnnotationMappingIid);
      in.End(f);
    }
    uint64_t index = 0;
    for (const Doc::PlaneInfo& info : doc_.planes) {
      for (const Doc::PlaneInfo::AnnotatedStack& a : info.annotated) {
        stack.clear();
        for (uint32_t id = a.leaf; id != 0 && stack.size() < kMaxStackDepth; id = info.nodes[id].parent)
          stack.push_back(id);
        const size_t c = in.Begin(kInternedCallstacks);
        o_.VarintField(kEntryIid, doc_.extra_iid_base + index++);
        for (uint32_t k : a.annotations) o_.VarintField(kCallstackFrameIds, doc_.extra_iid_base + k);
        for (size_t k = stack.size(); k-- > 0;) o_.VarintField(kCallstackFrameIds, info.name_base + stack[k]);
        in.End(c);
      }
    }
  }

  // "<name> <tid> CPU samples" -> "<name>".
  static std::string_view SampledThreadName(const model::Line& l) {
    std::string_view name = l.display_name.empty() ? std::string_view(l.name) : std::string_view(l.display_name);
    constexpr std::string_view kSuffix = " CPU samples";
    if (name.size() >= kSuffix.size() && name.substr(name.size() - kSuffix.size()) == kSuffix) {
      name.remove_suffix(kSuffix.size());
      const size_t space = name.rfind(' ');
      if (space != std::string_view::npos &&
          name.find_first_not_of("0123456789", space + 1) == std::string_view::npos && space + 1 < name.size())
        name = name.substr(0, space);
    }
    return name;
  }

  void Process(const Doc::PlaneInfo& info) {
    const model::Plane& p = *info.plane;
    size_t pk = BeginPacket(doc_.start_ns);
    size_t td = o_.Open(kPacketTrackDescriptor);
    o_.VarintField(kTrackUuid, info.uuid);
    size_t pd = o_.Open(kTrackProcess);
    o_.VarintField(kProcessPid, static_cast<uint64_t>(info.pid));
    o_.BytesField(kProcessName, p.name);
    for (const model::Stat& s : p.stats)
      if (s.kind == model::StatKind::kString && p.stat_name(s) == model::kProcessNameStat) {
        std::string label(p.stat_str(s));
        if (info.os_pid > 0) label += " (pid " + std::to_string(info.os_pid) + ")";
        o_.BytesField(kProcessLabels, label);
      }
    o_.Close(pd);
    o_.Close(td);
    o_.Close(pk);
  }

  enum class Kind { kThread, kLane, kCounter, kBytesCounter };
  // A thread's track (`line` of `pid`), a track beside it or a counter track
  // (both under `parent`).
  void Track(Kind kind, uint64_t uuid, uint64_t parent, const model::Line* line, int64_t pid,
             std::string_view name) {
    size_t pk = BeginPacket(doc_.start_ns);
    size_t td = o_.Open(kPacketTrackDescriptor);
    o_.VarintField(kTrackUuid, uuid);
    if (kind == Kind::kThread) {
      size_t th = o_.Open(kTrackThread);
      o_.VarintField(kThreadPid, static_cast<uint64_t>(pid));
      // As the trace JSON: the display id if set, narrowed to 32 bits.
      o_.VarintField(kThreadTid, static_cast<uint32_t>(line->display_id ? line->display_id : line->id));
      if (!name.empty()) o_.BytesField(kThreadName, name);
      o_.Close(th);
    } else {
      o_.VarintField(kTrackParentUuid, parent);
      o_.BytesField(kTrackName, name);
      if (kind != Kind::kLane) {
        size_t c = o_.Open(kTrackCounter);
        if (kind == Kind::kBytesCounter) o_.VarintField(kCounterUnit, kUnitSizeBytes);
        o_.Close(c);
      }
    }
    o_.Close(td);
    o_.Close(pk);
  }

  void Annotation(const Doc::PlaneInfo& info, const model::Stat& s) {
    const model::Plane& p = *info.plane;
    size_t a = o_.Open(kEventDebugAnnotations);
    o_.VarintField(kAnnotationNameIid, info.stat_base + s.metadata_id);
    switch (s.kind) {
      case model::StatKind::kInt64: o_.VarintField(kAnnotationInt, static_cast<uint64_t>(s.i64)); break;
      case model::StatKind::kUint64: o_.VarintField(kAnnotationUint, s.u64); break;
      case model::StatKind::kDouble: o_.DoubleField(kAnnotationDouble, s.f64); break;
      case model::StatKind::kString: o_.BytesField(kAnnotationString, p.stat_str(s)); break;
      case model::StatKind::kBytes: o_.BytesField(kAnnotationString, "<opaque bytes>"); break;
      case model::StatKind::kRef:
        o_.BytesField(kAnnotationString,
                      s.ref < p.stat_metadata().size() ? std::string_view(p.stat_metadata()[s.ref].name) : "");
        break;
    }
    o_.Close(a);
  }

  void Flows(const Doc::PlaneInfo& info, std::span<const model::Stat> stats) {
    uint64_t producer = 0, producer_type = 0, consumer = 0, consumer_type = 0;
    bool has_producer = false, has_consumer = false;
    for (const model::Stat& s : stats) {
      if (!IsInt(s) || s.metadata_id == 0) continue;
      const uint32_t id = s.metadata_id;
      const auto v = static_cast<uint64_t>(IntOf(s));
      if (id == info.correlation) o_.Fixed64Field(kEventFlowIds, FlowId(static_cast<uint64_t>(info.os_pid), 1, v));
      else if (id == info.producer) producer = v, has_producer = true;
      else if (id == info.producer_type) producer_type = v;
      else if (id == info.consumer) consumer = v, has_consumer = true;
      else if (id == info.consumer_type) consumer_type = v;
    }
    // A producer and its consumers share (type, id); the earliest is the source.
    if (has_producer) o_.Fixed64Field(kEventFlowIds, FlowId(2, producer_type, producer));
    if (has_consumer) o_.Fixed64Field(kEventFlowIds, FlowId(2, consumer_type, consumer));
  }

  // A BEGIN or INSTANT with args or flows.
  void Begin(const Doc::PlaneInfo& info, const model::Line& l, const model::Event& e, uint64_t ts, uint32_t type,
             uint64_t track) {
    const model::EventMetadata& md = info.plane->event_metadata()[e.metadata_id];
    const std::span<const model::Stat> stats = l.stats_of(e);
    size_t pk = BeginPacket(ts);
    size_t te = o_.Open(kPacketTrackEvent);
    o_.VarintField(kEventType, type);
    o_.VarintField(kEventTrackUuid, track);
    o_.VarintField(kEventNameIid, info.name_base + e.metadata_id);
    const auto shown = [&](const model::Stat& s) {
      return s.metadata_id < info.internal.size() && !info.internal[s.metadata_id];
    };
    for (const model::Stat& s : stats)
      if (shown(s)) Annotation(info, s);
    // The event's own value of a key wins over its name's (as in the JSON).
    for (const model::Stat& s : md.stats) {
      if (!shown(s)) continue;
      bool overridden = false;
      for (const model::Stat& t : stats) overridden = overridden || t.metadata_id == s.metadata_id;
      if (!overridden) Annotation(info, s);
    }
    if (info.has_flow_stats) Flows(info, stats);
    o_.Close(te);
    o_.Close(pk);
  }

  // A sample's callstack: its innermost node's, or with an annotation stack
  // the annotated one (AnnotatedStacks).
  uint64_t CallstackOf(const Doc::PlaneInfo& info, const model::Line& l, const model::Event& e) const {
    if (info.annotation_key != 0)
      for (const model::Stat& s : l.stats_of(e))
        if (s.metadata_id == info.annotation_key && s.kind == model::StatKind::kRef) {
          auto it = info.annotated_index.find((uint64_t{e.metadata_id} << 32) | s.ref);
          if (it != info.annotated_index.end()) return doc_.extra_iid_base + it->second;
        }
    return info.name_base + e.metadata_id;
  }

  // One PerfSample per sample, on the samples' sequence, on its thread;
  // its stack the callstack of its innermost node (under its annotations).
  void Samples(const Doc::PlaneInfo& info, const Doc::LineInfo& li, size_t begin, size_t end) {
    const model::Line& l = *li.line;
    for (size_t i = begin; i < end; ++i) {
      const model::Event& e = l.events[i];
      size_t pk = BeginPacket(NsAt(l.timestamp_ns, e.offset_ps), kSampleSequenceId);
      o_.VarintField(kPacketSequenceFlags, kSeqNeedsIncrementalState);
      size_t ps = o_.Open(kPacketPerfSample);
      o_.VarintField(kSamplePid, static_cast<uint64_t>(info.pid));
      o_.VarintField(kSampleTid, li.tid);
      if (e.metadata_id != 0 && e.metadata_id < info.nodes.size())
        o_.VarintField(kSampleCallstackIid, CallstackOf(info, l, e));
      o_.VarintField(kSampleCpuMode, kCpuModeUser);
      o_.Close(ps);
      o_.Close(pk);
    }
  }

  // The common packets, written in one go: every length is known before.
  // (No SEQ_NEEDS_INCREMENTAL_STATE flag: the names are defined in the head,
  // after the one clear, so the state is always valid; 2 bytes saved a packet.)
  void PlainBegin(uint64_t ts, uint32_t type, uint64_t track, uint64_t iid) {
    const size_t event_len = 2 + 1 + VarintSize(track) + 1 + VarintSize(iid);
    const size_t packet_len = 1 + VarintSize(ts) + 2 + 2 + event_len;  // < 128: one length byte
    uint8_t* p = o_.Room(2 + packet_len);
    *p++ = (kTracePacket << 3) | kBytes;
    *p++ = static_cast<uint8_t>(packet_len);
    *p++ = (kPacketTimestamp << 3) | kVarint;
    p = PutVarint(p, ts);
    *p++ = (kPacketSequenceId << 3) | kVarint;
    *p++ = kSequenceId;
    *p++ = (kPacketTrackEvent << 3) | kBytes;
    *p++ = static_cast<uint8_t>(event_len);
    *p++ = (kEventType << 3) | kVarint;
    *p++ = static_cast<uint8_t>(type);
    *p++ = (kEventTrackUuid << 3) | kVarint;
    p = PutVarint(p, track);
    *p++ = (kEventNameIid << 3) | kVarint;
    p = PutVarint(p, iid);
    o_.Commit(p);
  }
  void End(uint64_t ts, uint64_t track) {
    const size_t event_len = 2 + 1 + VarintSize(track);
    const size_t packet_len = 1 + VarintSize(ts) + 2 + 2 + event_len;
    uint8_t* p = o_.Room(2 + packet_len);
    *p++ = (kTracePacket << 3) | kBytes;
    *p++ = static_cast<uint8_t>(packet_len);
    *p++ = (kPacketTimestamp << 3) | kVarint;
    p = PutVarint(p, ts);
    *p++ = (kPacketSequenceId << 3) | kVarint;
    *p++ = kSequenceId;
    *p++ = (kPacketTrackEvent << 3) | kBytes;
    *p++ = static_cast<uint8_t>(event_len);
    *p++ = (kEventType << 3) | kVarint;
    *p++ = kTypeSliceEnd;
    *p++ = (kEventTrackUuid << 3) | kVarint;
    p = PutVarint(p, track);
    o_.Commit(p);
  }

  void Events(const Doc::PlaneInfo& info, const Doc::LineInfo& li, size_t begin, size_t end) {
    const model::Line& l = *li.line;
    const std::vector<model::EventMetadata>& metadata = info.plane->event_metadata();
    for (size_t i = begin; i < end; ++i) {
      const model::Event& e = l.events[li.order.empty() ? i : li.order[i]];
      const uint64_t track = li.lane_uuids[li.lane.empty() ? 0 : li.lane[i]];
      const uint64_t ts = NsAt(l.timestamp_ns, e.offset_ps);
      const uint64_t end_ns = NsAt(l.timestamp_ns, EndPs(e));
      const uint32_t type = end_ns == ts ? kTypeInstant : kTypeSliceBegin;
      if (e.stats == model::kNoStats && metadata[e.metadata_id].stats.empty())
        PlainBegin(ts, type, track, info.name_base + e.metadata_id);
      else
        Begin(info, l, e, ts, type, track);
      if (type == kTypeSliceBegin) End(end_ns, track);
    }
  }

  // Each numeric stat of a counter event is a sample of the counter track
  // (event name, stat): live bytes of memory, a GPU's PM metrics.
  void Counters(const Doc::PlaneInfo& info, const model::Line& l, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const model::Event& e = l.events[i];
      for (const model::Stat& s : l.stats_of(e)) {
        if (!IsInt(s) && s.kind != model::StatKind::kDouble) continue;
        auto it = info.counter_uuid.find((uint64_t{e.metadata_id} << 32) | s.metadata_id);
        size_t pk = BeginPacket(NsAt(l.timestamp_ns, e.offset_ps));
        size_t te = o_.Open(kPacketTrackEvent);
        o_.VarintField(kEventType, kTypeCounter);
        o_.VarintField(kEventTrackUuid, it->second);
        if (s.kind == model::StatKind::kDouble) o_.DoubleField(kEventDoubleCounterValue, s.f64);
        else o_.VarintField(kEventCounterValue, static_cast<uint64_t>(IntOf(s)));
        o_.Close(te);
        o_.Close(pk);
      }
    }
  }

  // What the recorder dropped or overwrote: TraceStats' packet loss, which
  // the UI flags as data loss.
  void Tail() {
    if (doc_.lost == 0) return;
    size_t pk = o_.Open(kTracePacket);
    o_.VarintField(kPacketSequenceId, kSequenceId);
    size_t ts = o_.Open(kPacketTraceStats);
    size_t bs = o_.Open(kStatsBufferStats);
    o_.VarintField(kBufferPacketLoss, doc_.lost);
    o_.Close(bs);
    o_.Close(ts);
    o_.Close(pk);
  }

  const Doc& doc_;
  Out& o_;
};

// Workers encode slices; the calling thread hands them out and writes the
// finished ones in order. 2 slots per worker are in flight at most, so
// memory stays bounded whatever the model's size. 0 or the errno of the failure.
int WriteSlices(const Doc& doc, int fd, int threads) {
  struct Slot {
    Slice slice;
    Out out;
    bool done = false;
  };
  const size_t n_slots = 2 * static_cast<size_t>(threads);
  std::vector<Slot> slots(n_slots);
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  uint64_t queued = 0, taken = 0;
  bool stop = false;
  auto work = [&] {
    for (;;) {
      Slot* slot;
      {
        std::unique_lock<std::mutex> lock(mu);
        work_cv.wait(lock, [&] { return stop || taken < queued; });
        if (taken == queued) return;
        slot = &slots[taken++ % n_slots];
      }
      slot->out.clear();
      Encoder(doc, slot->out).Encode(slot->slice);
      {
        std::lock_guard<std::mutex> lock(mu);
        slot->done = true;
      }
      done_cv.notify_one();
    }
  };
  std::vector<std::thread> pool;
  JoinWorkers join(pool, mu, work_cv, stop);
  for (int i = 0; i < threads; ++i) pool.emplace_back(work);

  int err = 0;
  uint64_t written = 0;
  auto write_oldest = [&] {
    Slot& s = slots[written % n_slots];
    {
      std::unique_lock<std::mutex> lock(mu);
      done_cv.wait(lock, [&] { return s.done; });
    }
    ++written;
    return WriteAll(fd, s.out.view());
  };
  ForEachSlice(doc, [&](const Slice& slice) {
    if (queued - written == n_slots && (err = write_oldest()) != 0) return false;
    Slot& s = slots[queued % n_slots];
    {
      std::lock_guard<std::mutex> lock(mu);
      s.slice = slice;
      s.done = false;
      ++queued;
    }
    work_cv.notify_one();
    return true;
  });
  while (err == 0 && written < queued) err = write_oldest();
  return err;
}

int WritePerfettoTraceFd(const model::Space& space, const PerfettoTraceOptions& options, int fd) {
  int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, kMaxPerfettoTraceThreads);
  const Doc doc(space);
  if (threads > 1) return WriteSlices(doc, fd, threads);
  Out out;
  int err = 0;
  ForEachSlice(doc, [&](const Slice& slice) {
    out.clear();
    Encoder(doc, out).Encode(slice);
    err = WriteAll(fd, out.view());
    return err == 0;
  });
  return err;
}

}  // namespace

bool StreamPerfettoTrace(const model::Space& space, const std::function<bool(std::string_view)>& sink) {
  const Doc doc(space);
  Out out;
  bool ok = true;
  ForEachSlice(doc, [&](const Slice& slice) {
    out.clear();
    Encoder(doc, out).Encode(slice);
    ok = sink(out.view());
    return ok;
  });
  return ok;
}

Status WritePerfettoTrace(const model::Space& space, const std::string& path, const PerfettoTraceOptions& options) {
  return WriteOutputFile(path, [&](int fd) { return WritePerfettoTraceFd(space, options, fd); });
}

Status WritePerfettoTrace(const model::Space& space, const OutputDir& dir, const std::string& name,
                          const PerfettoTraceOptions& options) {
  return dir.Write(name, [&](int fd) { return WritePerfettoTraceFd(space, options, fd); });
}

std::string PerfettoTraceString(const model::Space& space) {
  std::string out;
  StreamPerfettoTrace(space, [&](std::string_view block) {
    out.append(block);
    return true;
  });
  return out;
}

}  // namespace spyglass::exporter
