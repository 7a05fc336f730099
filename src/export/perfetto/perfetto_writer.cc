#include "export/perfetto/perfetto_writer.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "export/output_file.h"
#include "model/schema.h"

namespace spyglass::exporter {
namespace {

// A hand-written encoder of the few fields written (their numbers are wire
// facts, spec PERFETTO.md) instead of Perfetto's protos: the amalgamated
// perfetto_trace.proto is 680 KB of someone else's schema to vendor and
// compile for some thirty fields, and generated classes would build each
// packet as an object before serializing it. Writing the bytes directly is
// what keeps this writer ahead of trace.json.gz (BENCHMARKS.md). The tests
// decode the output with the Perfetto project's own classes (PyPI perfetto),
// so a wrong number or wire type here shows there.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kBytes = 2;

// Trace
constexpr uint32_t kTracePacket = 1;
// TracePacket
constexpr uint32_t kPacketTimestamp = 8, kPacketSequenceId = 10, kPacketTrackEvent = 11, kPacketInternedData = 12,
                   kPacketSequenceFlags = 13, kPacketTraceStats = 35, kPacketTrackDescriptor = 60,
                   kPacketFirstOnSequence = 87;
constexpr uint32_t kSeqIncrementalStateCleared = 1, kSeqNeedsIncrementalState = 2;
// TrackEvent
constexpr uint32_t kEventDebugAnnotations = 4, kEventType = 9, kEventNameIid = 10, kEventTrackUuid = 11,
                   kEventCounterValue = 30, kEventDoubleCounterValue = 44, kEventFlowIds = 47;
constexpr uint32_t kTypeSliceBegin = 1, kTypeSliceEnd = 2, kTypeInstant = 3, kTypeCounter = 4;
// InternedData and its entries (EventName, DebugAnnotationName: iid 1, name 2)
constexpr uint32_t kInternedEventNames = 2, kInternedDebugAnnotationNames = 3, kEntryIid = 1, kEntryName = 2;
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
// Device planes have no process of their own: their pids start above any
// real one (Linux's pid_max is at most 2^22), so that a profiled pid 1 (a
// container's) never shares its process with GPU 0.
constexpr int64_t kDevicePidBase = 0x40000000;
constexpr int64_t kHostPidFallback = 701;  // the host plane's pid in the trace JSON

// The output: a block of bytes handed to the sink once past kBlock, at a
// packet's end. Nested messages get a one-byte length when opened, widened
// in place when they close longer (rare: a long name or many args), so a
// packet is written once, front to back.
class Out {
 public:
  static constexpr size_t kBlock = 1 << 20;
  explicit Out(const std::function<bool(std::string_view)>& sink) : sink_(sink), buf_(kBlock + 4096) {}

  void Varint(uint64_t v) {
    Reserve(10);
    uint8_t* p = buf_.data() + n_;
    while (v >= 0x80) {
      *p++ = static_cast<uint8_t>(v | 0x80);
      v >>= 7;
    }
    *p++ = static_cast<uint8_t>(v);
    n_ = static_cast<size_t>(p - buf_.data());
  }
  void Key(uint32_t number, uint32_t type) { Varint((uint64_t{number} << 3) | type); }
  void VarintField(uint32_t number, uint64_t v) {
    Key(number, kVarint);
    Varint(v);
  }
  void Fixed64Field(uint32_t number, uint64_t v) {
    Key(number, kFixed64);
    Reserve(8);
    for (int i = 0; i < 8; ++i) buf_[n_++] = static_cast<uint8_t>(v >> (8 * i));  // little-endian on the wire
  }
  void DoubleField(uint32_t number, double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    Fixed64Field(number, bits);
  }
  void BytesField(uint32_t number, std::string_view s) {
    Key(number, kBytes);
    Varint(s.size());
    Reserve(s.size());
    if (!s.empty()) std::memcpy(buf_.data() + n_, s.data(), s.size());
    n_ += s.size();
  }
  // Opens a length-delimited field; returns what Close takes.
  size_t Open(uint32_t number) {
    Key(number, kBytes);
    Reserve(1);
    buf_[n_] = 0;
    return n_++;
  }
  void Close(size_t at) {
    const size_t len = n_ - at - 1;
    if (len < 0x80) {
      buf_[at] = static_cast<uint8_t>(len);
      return;
    }
    size_t width = 1;
    for (uint64_t v = len; v >= 0x80; v >>= 7) ++width;
    Reserve(width - 1);
    std::memmove(buf_.data() + at + width, buf_.data() + at + 1, len);
    uint8_t* p = buf_.data() + at;
    for (uint64_t v = len; v >= 0x80; v >>= 7) *p++ = static_cast<uint8_t>(v | 0x80);
    *p = static_cast<uint8_t>(len >> (7 * (width - 1)));
    n_ += width - 1;
  }
  // Between packets: a full block goes out.
  bool EndPacket() { return n_ >= kBlock ? Flush() : ok_; }
  bool Flush() {
    if (n_ > 0 && ok_) ok_ = sink_(std::string_view(reinterpret_cast<const char*>(buf_.data()), n_));
    n_ = 0;
    return ok_;
  }
  bool ok() const { return ok_; }

 private:
  void Reserve(size_t k) {
    if (buf_.size() - n_ < k) buf_.resize(std::max(buf_.size() * 2, n_ + k));  // one packet bigger than a block
  }
  const std::function<bool(std::string_view)>& sink_;
  std::vector<uint8_t> buf_;
  size_t n_ = 0;
  bool ok_ = true;
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

int64_t IntOf(const model::Stat& s) {
  return s.kind == model::StatKind::kUint64 ? static_cast<int64_t>(s.u64) : s.i64;
}

// The process a plane was recorded in (its process_id stat), 0 if none.
int64_t ProcessIdOf(const model::Plane& p) {
  for (const model::Stat& s : p.stats)
    if ((s.kind == model::StatKind::kInt64 || s.kind == model::StatKind::kUint64) &&
        p.stat_name(s) == model::kProcessIdStat)
      return IntOf(s);
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

class Writer {
 public:
  Writer(const model::Space& space, Out& out) : space_(space), o_(out) {}

  bool Write() {
    uint64_t names = 0, stats = 0;
    for (const model::Plane& p : space_.planes) {
      bool any = false;
      for (const model::Line& l : p.lines) any = any || !l.events.empty();
      if (!any) continue;  // /host:metadata, Task Environment, empty devices
      PlaneInfo& info = planes_.emplace_back();
      info.plane = &p;
      info.name_base = names;
      info.stat_base = stats;
      names += p.event_metadata().size();
      stats += p.stat_metadata().size();
      info.internal.resize(p.stat_metadata().size());
      for (size_t i = 0; i < p.stat_metadata().size(); ++i) {
        const std::string& n = p.stat_metadata()[i].name;
        info.internal[i] = IsInternalStat(n);
        if (n == model::kCorrelationIdStat) info.correlation = static_cast<uint32_t>(i);
        else if (n == "_p") info.producer = static_cast<uint32_t>(i);
        else if (n == "_pt") info.producer_type = static_cast<uint32_t>(i);
        else if (n == "_c") info.consumer = static_cast<uint32_t>(i);
        else if (n == "_ct") info.consumer_type = static_cast<uint32_t>(i);
      }
      info.has_flow_stats = info.correlation | info.producer | info.consumer;
    }
    name_sent_.assign(names, 0);
    stat_name_sent_.assign(stats, 0);
    AssignPids();
    start_ns_ = FirstNs();

    // The sequence starts with its state cleared: only then does
    // trace_processor accept the interned data that follows.
    size_t pk = BeginPacket(start_ns_, kSeqIncrementalStateCleared);
    o_.VarintField(kPacketFirstOnSequence, 1);
    EndPacket(pk);
    for (PlaneInfo& info : planes_) {
      WriteProcess(info);
      for (const model::Line& l : info.plane->lines) {
        if (l.events.empty()) continue;
        if (l.name == model::kCounterLineName) WriteCounters(info, l);
        else WriteSlices(info, l);
        if (!o_.ok()) return false;
      }
    }
    WriteLoss();
    // CPU samples (the sampler) would go here, on a sequence of their own:
    // InternedData.function_names/frames/callstacks (+ mappings, build ids)
    // and one StreamingProfilePacket (callstack_iid + timestamp_delta_us per
    // sample, keyed to the thread by its pid/tid through a ThreadDescriptor
    // packet on that sequence) or PerfSample packet per sample; or, for
    // samples taken inside slices, TrackEvent.callstack_iid on an instant of
    // the thread's track. Nothing above needs to change for it.
    return o_.Flush();
  }

 private:
  struct PlaneInfo {
    const model::Plane* plane = nullptr;
    int64_t pid = 0;
    int64_t os_pid = 0;  // the recorded process (flows are per process)
    uint64_t uuid = 0;   // the process track
    uint64_t name_base = 0, stat_base = 0;  // iid = base + metadata id
    std::vector<uint8_t> internal;          // by stat metadata id
    uint32_t correlation = 0, producer = 0, producer_type = 0, consumer = 0, consumer_type = 0;
    bool has_flow_stats = false;
    std::unordered_map<uint64_t, uint64_t> counter_tracks;  // (event, stat metadata id) -> uuid
  };
  struct Open {
    int64_t end_ps;
    uint64_t end_ns;
  };
  struct Lane {
    uint64_t uuid;
    std::vector<Open> open;
  };

  void AssignPids() {
    std::vector<int64_t> used;
    int64_t device = 0;
    for (PlaneInfo& info : planes_) {
      info.os_pid = ProcessIdOf(*info.plane);
      int64_t pid = 0;
      if (IsHostPlane(*info.plane)) pid = info.os_pid > 0 ? info.os_pid : kHostPidFallback;
      if (pid <= 0 || pid > INT32_MAX || std::find(used.begin(), used.end(), pid) != used.end())
        pid = kDevicePidBase + device++;
      used.push_back(pid);
      info.pid = pid;
    }
  }

  // The earliest event: the descriptors' time (trace_processor orders a
  // track's creation by it; 0 would stretch the trace back to the epoch).
  uint64_t FirstNs() const {
    uint64_t first = UINT64_MAX;
    for (const PlaneInfo& info : planes_)
      for (const model::Line& l : info.plane->lines) {
        if (l.events.empty()) continue;
        int64_t min_ps = INT64_MAX;
        for (const model::Event& e : l.events) min_ps = std::min(min_ps, e.offset_ps);
        first = std::min(first, NsAt(l.timestamp_ns, min_ps));
      }
    return first == UINT64_MAX ? 0 : first;
  }

  size_t BeginPacket(uint64_t ts, uint32_t flags) {
    size_t pk = o_.Open(kTracePacket);
    o_.VarintField(kPacketTimestamp, ts);
    o_.VarintField(kPacketSequenceId, kSequenceId);
    if (flags != 0) o_.VarintField(kPacketSequenceFlags, flags);
    return pk;
  }
  void EndPacket(size_t pk) {
    o_.Close(pk);
    o_.EndPacket();
  }

  void WriteProcess(PlaneInfo& info) {
    const model::Plane& p = *info.plane;
    info.uuid = next_uuid_++;
    size_t pk = BeginPacket(start_ns_, 0);
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
    EndPacket(pk);
  }

  enum class Kind { kThread, kLane, kCounter, kBytesCounter };
  // A thread's track (`line` and `pid`), a lane beside it or a counter track
  // (both under `parent`).
  uint64_t TrackDescriptor(Kind kind, uint64_t parent, const model::Line* line, int64_t pid, std::string_view name) {
    const uint64_t uuid = next_uuid_++;
    size_t pk = BeginPacket(start_ns_, 0);
    size_t td = o_.Open(kPacketTrackDescriptor);
    o_.VarintField(kTrackUuid, uuid);
    if (kind == Kind::kThread) {
      size_t th = o_.Open(kTrackThread);
      o_.VarintField(kThreadPid, static_cast<uint64_t>(pid));
      // As the trace JSON: the display id if set, narrowed to 32 bits.
      const auto tid = static_cast<uint32_t>(line->display_id ? line->display_id : line->id);
      o_.VarintField(kThreadTid, tid);
      if (!name.empty()) o_.BytesField(kThreadName, name);
      o_.Close(th);
    } else {
      o_.VarintField(kTrackParentUuid, parent);
      o_.BytesField(kTrackName, name);
      if (kind == Kind::kCounter || kind == Kind::kBytesCounter) {
        size_t c = o_.Open(kTrackCounter);
        if (kind == Kind::kBytesCounter) o_.VarintField(kCounterUnit, kUnitSizeBytes);
        o_.Close(c);
      }
    }
    o_.Close(td);
    EndPacket(pk);
    return uuid;
  }

  // Defines, in the packet being written, the names its event uses first.
  void InternNames(const PlaneInfo& info, uint32_t name_id, std::span<const model::Stat> stats,
                   std::span<const model::Stat> md_stats) {
    const model::Plane& p = *info.plane;
    size_t id = 0;
    bool open = false;
    auto ensure_open = [&] {
      if (!open) id = o_.Open(kPacketInternedData);
      open = true;
    };
    const uint64_t iid = info.name_base + name_id;
    if (!name_sent_[iid]) {
      name_sent_[iid] = 1;
      ensure_open();
      const model::EventMetadata& md = p.event_metadata()[name_id];
      size_t en = o_.Open(kInternedEventNames);
      o_.VarintField(kEntryIid, iid);
      o_.BytesField(kEntryName, md.display_name.empty() ? md.name : md.display_name);
      o_.Close(en);
    }
    for (std::span<const model::Stat> list : {stats, md_stats})
      for (const model::Stat& s : list) {
        if (s.metadata_id >= info.internal.size() || info.internal[s.metadata_id]) continue;
        const uint64_t sid = info.stat_base + s.metadata_id;
        if (stat_name_sent_[sid]) continue;
        stat_name_sent_[sid] = 1;
        ensure_open();
        size_t en = o_.Open(kInternedDebugAnnotationNames);
        o_.VarintField(kEntryIid, sid);
        o_.BytesField(kEntryName, p.stat_name(s));
        o_.Close(en);
      }
    if (open) o_.Close(id);
  }

  void Annotation(const PlaneInfo& info, const model::Stat& s) {
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

  void Flows(const PlaneInfo& info, std::span<const model::Stat> stats) {
    uint64_t producer = 0, producer_type = 0, consumer = 0, consumer_type = 0;
    bool has_producer = false, has_consumer = false;
    for (const model::Stat& s : stats) {
      if (s.kind != model::StatKind::kUint64 && s.kind != model::StatKind::kInt64) continue;
      const uint32_t id = s.metadata_id;
      if (id == info.correlation && info.correlation != 0)
        o_.Fixed64Field(kEventFlowIds, FlowId(static_cast<uint64_t>(info.os_pid), 1, static_cast<uint64_t>(IntOf(s))));
      else if (id == info.producer && id != 0) producer = static_cast<uint64_t>(IntOf(s)), has_producer = true;
      else if (id == info.producer_type && id != 0) producer_type = static_cast<uint64_t>(IntOf(s));
      else if (id == info.consumer && id != 0) consumer = static_cast<uint64_t>(IntOf(s)), has_consumer = true;
      else if (id == info.consumer_type && id != 0) consumer_type = static_cast<uint64_t>(IntOf(s));
    }
    // A producer and its consumers share (type, id); the earliest is the source.
    if (has_producer) o_.Fixed64Field(kEventFlowIds, FlowId(2, producer_type, producer));
    if (has_consumer) o_.Fixed64Field(kEventFlowIds, FlowId(2, consumer_type, consumer));
  }

  void Begin(const PlaneInfo& info, const model::Line& l, const model::Event& e, uint64_t ts, uint32_t type,
             uint64_t track) {
    const model::Plane& p = *info.plane;
    const model::EventMetadata& md = p.event_metadata()[e.metadata_id];
    const std::span<const model::Stat> stats = l.stats_of(e);
    const std::span<const model::Stat> md_stats = md.stats;
    size_t pk = BeginPacket(ts, kSeqNeedsIncrementalState);
    InternNames(info, e.metadata_id, stats, md_stats);
    size_t te = o_.Open(kPacketTrackEvent);
    o_.VarintField(kEventType, type);
    o_.VarintField(kEventTrackUuid, track);
    o_.VarintField(kEventNameIid, info.name_base + e.metadata_id);
    for (const model::Stat& s : stats)
      if (s.metadata_id < info.internal.size() && !info.internal[s.metadata_id]) Annotation(info, s);
    // The event's own value of a key wins over its name's (as in the JSON).
    for (const model::Stat& s : md_stats) {
      if (s.metadata_id >= info.internal.size() || info.internal[s.metadata_id]) continue;
      bool overridden = false;
      for (const model::Stat& t : stats) overridden = overridden || t.metadata_id == s.metadata_id;
      if (!overridden) Annotation(info, s);
    }
    if (info.has_flow_stats && !stats.empty()) Flows(info, stats);
    o_.Close(te);
    EndPacket(pk);
  }

  void End(uint64_t ts, uint64_t track) {
    size_t pk = BeginPacket(ts, 0);
    size_t te = o_.Open(kPacketTrackEvent);
    o_.VarintField(kEventType, kTypeSliceEnd);
    o_.VarintField(kEventTrackUuid, track);
    o_.Close(te);
    EndPacket(pk);
  }

  void CloseUntil(Lane& lane, int64_t ps) {
    while (!lane.open.empty() && lane.open.back().end_ps <= ps) {
      End(lane.open.back().end_ns, lane.uuid);
      lane.open.pop_back();
    }
  }

  // The line's events as slices of its thread track, parents before
  // children; one that overlaps an open slice without nesting in it goes to
  // the first extra track where it nests.
  void WriteSlices(const PlaneInfo& info, const model::Line& l) {
    const std::string& name = l.display_name.empty() ? l.name : l.display_name;
    std::vector<Lane> lanes;
    lanes.push_back({TrackDescriptor(Kind::kThread, 0, &l, info.pid, name), {}});
    const auto before = [](const model::Event& a, const model::Event& b) {
      return a.offset_ps != b.offset_ps ? a.offset_ps < b.offset_ps : a.duration_ps > b.duration_ps;
    };
    std::vector<uint32_t> order;
    if (!std::is_sorted(l.events.begin(), l.events.end(), before)) {
      order.resize(l.events.size());
      std::iota(order.begin(), order.end(), 0u);
      std::stable_sort(order.begin(), order.end(),
                       [&](uint32_t a, uint32_t b) { return before(l.events[a], l.events[b]); });
    }
    for (size_t i = 0; i < l.events.size() && o_.ok(); ++i) {
      const model::Event& e = l.events[order.empty() ? i : order[i]];
      const int64_t end_ps = EndPs(e);
      size_t k = 0;
      for (;; ++k) {
        if (k == lanes.size()) lanes.push_back({TrackDescriptor(Kind::kLane, lanes[0].uuid, &l, 0, name), {}});
        CloseUntil(lanes[k], e.offset_ps);
        if (lanes[k].open.empty() || lanes[k].open.back().end_ps >= end_ps) break;
      }
      const uint64_t ts = NsAt(l.timestamp_ns, e.offset_ps);
      const uint64_t end_ns = NsAt(l.timestamp_ns, end_ps);
      if (end_ns == ts) {
        Begin(info, l, e, ts, kTypeInstant, lanes[k].uuid);
      } else {
        Begin(info, l, e, ts, kTypeSliceBegin, lanes[k].uuid);
        lanes[k].open.push_back({end_ps, end_ns});
      }
    }
    for (Lane& lane : lanes) CloseUntil(lane, INT64_MAX);
  }

  // Each numeric stat of a counter event is a sample of the counter track
  // (event name, stat): live bytes of memory, a GPU's PM metrics.
  void WriteCounters(PlaneInfo& info, const model::Line& l) {
    const model::Plane& p = *info.plane;
    for (const model::Event& e : l.events) {
      for (const model::Stat& s : l.stats_of(e)) {
        if (s.kind != model::StatKind::kInt64 && s.kind != model::StatKind::kUint64 &&
            s.kind != model::StatKind::kDouble)
          continue;
        const uint64_t key = (uint64_t{e.metadata_id} << 32) | s.metadata_id;
        auto it = info.counter_tracks.find(key);
        if (it == info.counter_tracks.end()) {
          const model::EventMetadata& md = p.event_metadata()[e.metadata_id];
          const std::string& event_name = md.display_name.empty() ? md.name : md.display_name;
          const std::string& stat_name = p.stat_name(s);
          const bool bytes = stat_name == model::kLiveBytesStat;
          // "memory cpu" (its one value: live bytes), a PM metric (named as
          // its stat); otherwise "<event> <stat>" as Perfetto names JSON counters.
          std::string track_name = bytes || stat_name == event_name ? event_name : event_name + " " + stat_name;
          it = info.counter_tracks.emplace(key, TrackDescriptor(bytes ? Kind::kBytesCounter : Kind::kCounter, info.uuid, nullptr, 0, track_name)).first;
        }
        size_t pk = BeginPacket(NsAt(l.timestamp_ns, e.offset_ps), 0);
        size_t te = o_.Open(kPacketTrackEvent);
        o_.VarintField(kEventType, kTypeCounter);
        o_.VarintField(kEventTrackUuid, it->second);
        if (s.kind == model::StatKind::kDouble) o_.DoubleField(kEventDoubleCounterValue, s.f64);
        else o_.VarintField(kEventCounterValue, static_cast<uint64_t>(IntOf(s)));
        o_.Close(te);
        EndPacket(pk);
      }
      if (!o_.ok()) return;
    }
  }

  // What the recorder dropped or overwrote: TraceStats' packet loss, which
  // the UI flags as data loss.
  void WriteLoss() {
    uint64_t lost = 0;
    for (const PlaneInfo& info : planes_)
      for (const model::Stat& s : info.plane->stats) {
        const std::string& n = info.plane->stat_name(s);
        if ((n == model::kDroppedEventsStat || n == model::kOverwrittenEventsStat ||
             n == model::kDroppedOverSizeLimitStat) &&
            (s.kind == model::StatKind::kUint64 || s.kind == model::StatKind::kInt64) && IntOf(s) > 0)
          lost += static_cast<uint64_t>(IntOf(s));
      }
    if (lost == 0) return;
    size_t pk = o_.Open(kTracePacket);
    o_.VarintField(kPacketSequenceId, kSequenceId);
    size_t ts = o_.Open(kPacketTraceStats);
    size_t bs = o_.Open(kStatsBufferStats);
    o_.VarintField(kBufferPacketLoss, lost);
    o_.Close(bs);
    o_.Close(ts);
    EndPacket(pk);
  }

  const model::Space& space_;
  Out& o_;
  std::vector<PlaneInfo> planes_;
  std::vector<uint8_t> name_sent_, stat_name_sent_;  // by iid
  // Track uuids: small numbers (one or two bytes an event); unique in the
  // file, which is all a single-file trace needs.
  uint64_t next_uuid_ = 1;
  uint64_t start_ns_ = 0;
};

}  // namespace

bool StreamPerfettoTrace(const model::Space& space, const std::function<bool(std::string_view)>& sink) {
  Out out(sink);
  Writer writer(space, out);
  return writer.Write();
}

namespace {

int WritePerfettoTraceFd(const model::Space& space, int fd) {
  int err = 0;
  StreamPerfettoTrace(space, [&](std::string_view block) {
    err = WriteAll(fd, block);
    return err == 0;
  });
  return err;
}

}  // namespace

Status WritePerfettoTrace(const model::Space& space, const std::string& path) {
  return WriteOutputFile(path, [&](int fd) { return WritePerfettoTraceFd(space, fd); });
}

Status WritePerfettoTrace(const model::Space& space, const OutputDir& dir, const std::string& name) {
  return dir.Write(name, [&](int fd) { return WritePerfettoTraceFd(space, fd); });
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
