#include "export/trace_json/trace_json_writer.h"

#include "common/gzip.h"
#include "common/utf8.h"
#include "export/join_workers.h"
#include "export/output_file.h"

#include <isa-l/crc.h>
#include <isa-l/igzip_lib.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace spyglass::exporter {
namespace {

// Stats that tsl's exporter treats as internal and hides from args.
bool IsInternalStat(std::string_view name) {
  return name == "_r" || name == "_p" || name == "_pt" || name == "_c" || name == "_ct" || name == "flops" ||
         name == "program_id" || name == "symbol_id";
}

// The process a plane was recorded in: its process_id stat (every plane of
// a session has one, children's and other hosts' planes too); 0 if none.
int64_t ProcessIdOf(const model::Plane& p) {
  for (const model::Stat& s : p.stats) {
    if (p.stat_name(s) != model::kProcessIdStat) continue;
    if (s.kind == model::StatKind::kInt64) return s.i64;
    if (s.kind == model::StatKind::kUint64) return static_cast<int64_t>(s.u64);
  }
  return 0;
}

// A host plane merged from another process or host ("/host:CPU [<tag>]").
bool IsMergedHostPlane(const model::Plane& p) {
  constexpr std::string_view prefix = model::kMergedHostPlanePrefix;
  return p.name.size() > prefix.size() && p.name.compare(0, prefix.size(), prefix) == 0 && p.name.back() == ']';
}

// Which planes go into the JSON: the host plane and the device planes of one
// kind (GPU, else TPU, else custom), as tsl does; the memory counter planes
// ride with the host.
std::vector<const model::Plane*> ExportedPlanes(const model::Space& space) {
  std::vector<const model::Plane*> out;
  if (const model::Plane* host = space.find_plane(model::kHostPlaneName)) out.push_back(host);
  // Host planes merged from other processes ("/host:CPU [<pid>]", subprocesses and multi-host captures).
  for (const model::Plane& p : space.planes)
    if (IsMergedHostPlane(p)) out.push_back(&p);
  for (std::string_view prefix : {model::kGpuPlanePrefix, model::kTpuPlanePrefix, model::kCustomPlanePrefix}) {
    size_t before = out.size();
    for (const model::Plane& p : space.planes)
      if (p.name.rfind(prefix, 0) == 0) out.push_back(&p);
    if (out.size() > before) break;
  }
  return out;
}

// Bytes that go into a JSON string as they are (no escape, ASCII).
constexpr auto kPlainByte = [] {
  std::array<bool, 256> t{};
  for (int c = 0x20; c < 0x80; ++c) t[c] = c != '"' && c != '\\';
  return t;
}();

// Formats into a fixed buffer and hands it to a sink whenever the next write
// would not fit, so that memory stays fixed whatever the strings' lengths.
class JsonOut {
 public:
  using Sink = std::function<bool(const char*, size_t)>;
  JsonOut(size_t capacity, Sink sink) : buf_(std::max<size_t>(capacity, kMaxFixed)), sink_(std::move(sink)) {
    p_ = buf_.data();
  }

  void raw(std::string_view s) {
    if (static_cast<size_t>(end() - p_) >= s.size()) {
      std::memcpy(p_, s.data(), s.size());
      p_ += s.size();
      return;
    }
    while (!s.empty()) {
      if (p_ == end()) flush();
      size_t n = std::min(s.size(), static_cast<size_t>(end() - p_));
      std::memcpy(p_, s.data(), n);
      p_ += n;
      s.remove_prefix(n);
    }
  }
  void ch(char c) {
    *room(1) = c;
    ++p_;
  }
  // Where the next element of traceEvents starts: a comma goes before every
  // element but the first, so the array needs no trailing `{}` (speedscope
  // rejects one).
  void set_first(bool first) { first_event_ = first; }
  void event(std::string_view head) {
    if (!first_event_) ch(',');
    first_event_ = false;
    raw(head);
  }
  void u64(uint64_t v) {
    char* d = room(20);
    p_ = std::to_chars(d, d + 20, v).ptr;
  }
  void i64(int64_t v) {
    char* d = room(20);
    p_ = std::to_chars(d, d + 20, v).ptr;
  }
  // Picoseconds as exact decimal microseconds ("12.345678"); no rounding.
  void micros_from_ps(int64_t ps) {
    uint64_t u = ps < 0 ? 0 - static_cast<uint64_t>(ps) : static_cast<uint64_t>(ps);
    micros(ps < 0, u / 1000000, static_cast<uint32_t>(u % 1000000));
  }
  // An event's time: its line's ns timestamp plus its ps offset, exact even
  // where the ps pass int64 (lines holding ns since the epoch, as some
  // writers leave them, or hostile values) while the microseconds do not.
  void micros_at(int64_t timestamp_ns, int64_t offset_ps) {
    int64_t ps;
    if (!__builtin_mul_overflow(timestamp_ns, int64_t{1000}, &ps) && !__builtin_add_overflow(ps, offset_ps, &ps))
      return micros_from_ps(ps);
    __int128 p = static_cast<__int128>(timestamp_ns) * 1000 + offset_ps;
    unsigned __int128 u = p < 0 ? 0 - static_cast<unsigned __int128>(p) : static_cast<unsigned __int128>(p);
    micros(p < 0, static_cast<uint64_t>(u / 1000000), static_cast<uint32_t>(u % 1000000));
  }
  // "-" if `negative`, the whole microseconds, then up to 6 digits of fraction.
  void micros(bool negative, uint64_t whole, uint32_t frac) {
    char* d = room(28);
    if (negative) *d++ = '-';
    d = std::to_chars(d, d + 20, whole).ptr;
    if (frac != 0) {
      *d++ = '.';
      for (int i = 5; i >= 0; --i) {
        d[i] = static_cast<char>('0' + frac % 10);
        frac /= 10;
      }
      int n = 6;
      while (d[n - 1] == '0') --n;
      d += n;
    }
    p_ = d;
  }
  // A JSON string literal; invalid UTF-8 becomes U+FFFD so the file always parses.
  void str(std::string_view s) {
    ch('"');
    size_t i = 0;
    while (i < s.size()) {
      size_t j = i;
      while (j < s.size() && kPlainByte[static_cast<unsigned char>(s[j])]) ++j;
      raw(s.substr(i, j - i));
      if (j == s.size()) break;
      i = j;
      unsigned char c = static_cast<unsigned char>(s[i]);
      if (c == '"' || c == '\\') {
        char* d = room(2);
        d[0] = '\\';
        d[1] = static_cast<char>(c);
        p_ += 2;
      } else if (c < 0x20) {
        static const char* hex = "0123456789abcdef";
        char* d = room(6);
        std::memcpy(d, "\\u00", 4);
        d[4] = hex[c >> 4];
        d[5] = hex[c & 15];
        p_ += 6;
      } else {
        const size_t len = Utf8SequenceLength(s, i);
        if (len != 0) {
          raw(s.substr(i, len));
          i += len - 1;
        } else {
          raw("\\ufffd");
        }
      }
      ++i;
    }
    ch('"');
  }
  bool flush() {
    if (p_ != buf_.data() && ok_) ok_ = sink_(buf_.data(), static_cast<size_t>(p_ - buf_.data()));
    p_ = buf_.data();
    return ok_;
  }

 private:
  static constexpr size_t kMaxFixed = 64;  // the most one fixed-size write (a number, an escape) takes
  char* end() { return buf_.data() + buf_.size(); }
  char* room(size_t n) {
    if (static_cast<size_t>(end() - p_) < n) flush();
    return p_;
  }
  std::vector<char> buf_;
  char* p_;
  Sink sink_;
  bool first_event_ = true;
  bool ok_ = true;
};

// Events on a counter line (XSpace's "_counters_", e.g. the memory tracer's
// live bytes per device) become Chrome counter events.
using model::kCounterLineName;

// What every slice of the document reads, computed once.
struct Doc {
  struct PlaneInfo {
    const model::Plane* plane;
    int64_t pid;
    std::vector<std::string> names;  // by event metadata id: the quoted display name (or name)
    std::vector<uint32_t> cost;      // by event metadata id: about how many bytes an event of it takes
  };
  const model::Space& space;
  const TraceJsonOptions& options;
  std::vector<PlaneInfo> planes;

  Doc(const model::Space& s, const TraceJsonOptions& o) : space(s), options(o) {
    std::string* quoted = nullptr;
    JsonOut q(4096, [&](const char* p, size_t n) {
      quoted->append(p, n);
      return true;
    });
    for (const model::Plane* p : ExportedPlanes(space)) {
      PlaneInfo& info = planes.emplace_back(PlaneInfo{p, PidOf(*p), {}, {}});
      for (const model::EventMetadata& md : p->event_metadata()) {
        quoted = &info.names.emplace_back();
        q.str(md.display_name.empty() ? md.name : md.display_name);
        q.flush();
        info.cost.push_back(static_cast<uint32_t>(
            std::min<size_t>(kEventBytes + info.names.back().size() + StatsBytes(*p, md.stats), UINT32_MAX)));
      }
    }
  }

  // The fixed part of a complete event, pid to name, at most.
  static constexpr size_t kEventBytes = 130;
  static size_t StatsBytes(const model::Plane& p, std::span<const model::Stat> stats) {
    size_t n = 0;
    for (const model::Stat& s : stats) {
      size_t str = p.stat_str(s).size();
      n += 8 + p.stat_name(s).size() + (str == 0 ? 24 : str);
    }
    return n;
  }
  static int64_t PidOf(const model::Plane& p) {
    if (p.name == model::kHostPlaneName) return kHostPid;
    if (IsMergedHostPlane(p))
      if (int64_t pid = ProcessIdOf(p); pid > 0) return pid;
    return 1 + p.id;
  }
};

// A slice of the document that formats on its own: the head (up to the
// metadata events), events [begin, end) of one line, or the tail.
struct Slice {
  enum Kind : uint8_t { kHead, kEvents, kCounters, kTail };
  Kind kind = kHead;
  bool first = false;  // no element of traceEvents comes before it
  uint32_t plane = 0;  // index into Doc::planes
  size_t line = 0;
  size_t begin = 0, end = 0;
};

// About this much JSON per slice: large enough that the per-slice costs (a
// fresh deflate state, a sync flush) vanish, small enough to bound memory.
constexpr size_t kSliceBytes = 1 << 20;

// Calls `emit` with each slice in document order until it returns false.
template <class Emit>
void ForEachSlice(const Doc& doc, Emit&& emit) {
  // The head writes a process_sort_index element per plane.
  bool any_element = !doc.planes.empty();
  if (!emit(Slice{Slice::kHead, true})) return;
  for (uint32_t pi = 0; pi < doc.planes.size(); ++pi) {
    const Doc::PlaneInfo& info = doc.planes[pi];
    for (size_t li = 0; li < info.plane->lines.size(); ++li) {
      const model::Line& l = info.plane->lines[li];
      Slice slice{l.name == kCounterLineName ? Slice::kCounters : Slice::kEvents, !any_element, pi, li, 0, 0};
      size_t bytes = 0;
      for (size_t i = 0; i < l.events.size(); ++i) {
        const model::Event& e = l.events[i];
        bytes += info.cost[e.metadata_id];
        bytes += Doc::StatsBytes(*info.plane, l.stats_of(e));
        if (bytes >= kSliceBytes || i + 1 == l.events.size()) {
          slice.end = i + 1;
          if (!emit(slice)) return;
          any_element = true;
          slice.first = false;
          slice.begin = i + 1;
          bytes = 0;
        }
      }
    }
  }
  emit(Slice{Slice::kTail, !any_element});
}

// Per-thread scratch space of the formatter.
struct Scratch {
  std::vector<const model::Stat*> args;
};

void WriteArgs(JsonOut& o, const model::Plane& plane, const model::EventMetadata& md,
               std::span<const model::Stat> stats, Scratch& scratch) {
  std::vector<const model::Stat*>& args = scratch.args;
  args.clear();
  for (const model::Stat& s : md.stats)
    if (!IsInternalStat(plane.stat_name(s))) args.push_back(&s);
  for (const model::Stat& s : stats)
    if (!IsInternalStat(plane.stat_name(s))) args.push_back(&s);
  if (args.empty()) return;
  // Keys sorted; of stats with the same key the last wins (event stats come
  // after metadata stats, so they override them): a stable sort keeps the
  // order of equal keys.
  auto less = [&](const model::Stat* a, const model::Stat* b) { return plane.stat_name(*a) < plane.stat_name(*b); };
  std::stable_sort(args.begin(), args.end(), less);
  o.raw(",\"args\":{");
  bool first = true;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i + 1 < args.size() && !less(args[i], args[i + 1])) continue;
    if (!first) o.ch(',');
    first = false;
    o.str(plane.stat_name(*args[i]));
    o.ch(':');
    o.str(plane.stat_text(*args[i]));
  }
  o.ch('}');
}

// {"ph":"C","name":<event name>,"args":{<stat>: <number>}}: Perfetto shows a counter track.
void WriteCounters(JsonOut& o, const Doc::PlaneInfo& info, const model::Line& l, size_t begin, size_t end) {
  const model::Plane& plane = *info.plane;
  for (size_t i = begin; i < end; ++i) {
    const model::Event& e = l.events[i];
    o.event("{\"ph\":\"C\",\"pid\":");
    o.i64(info.pid);
    o.raw(",\"ts\":");
    o.micros_at(l.timestamp_ns, e.offset_ps);
    o.raw(",\"name\":");
    o.raw(info.names[e.metadata_id]);
    o.raw(",\"args\":{");
    bool first = true;
    {
      for (const model::Stat& st : l.stats_of(e)) {
        if (st.kind != model::StatKind::kInt64 && st.kind != model::StatKind::kUint64 && st.kind != model::StatKind::kDouble)
          continue;
        if (!first) o.ch(',');
        first = false;
        o.str(plane.stat_name(st));
        o.ch(':');
        o.raw(plane.stat_text(st));
      }
    }
    o.raw("}}");
  }
}

void WriteEvents(JsonOut& o, const Doc::PlaneInfo& info, const model::Line& l, size_t begin, size_t end,
                 Scratch& scratch) {
  const auto& metadata = info.plane->event_metadata();
  uint32_t tid = static_cast<uint32_t>(l.display_id ? l.display_id : l.id);
  std::string head = "{\"ph\":\"X\",\"pid\":" + std::to_string(info.pid) + ",\"tid\":" + std::to_string(tid) + ",\"ts\":";
  // A GPU launch and its device event share a correlation_id: a flow arrow
  // (bind_id) from the host call to the device event.
  const model::StatMetadata* corr = info.plane->find_stat_metadata(model::kCorrelationIdStat);
  const char* flow = info.plane->name.rfind(model::kGpuPlanePrefix, 0) == 0 ? "\"flow_in\":true" : "\"flow_out\":true";
  for (size_t i = begin; i < end; ++i) {
    const model::Event& e = l.events[i];
    o.event(head);
    o.micros_at(l.timestamp_ns, e.offset_ps);
    o.raw(",\"dur\":");
    o.micros_from_ps(std::max<int64_t>(e.duration_ps, 1));
    o.raw(",\"name\":");
    o.raw(info.names[e.metadata_id]);
    const model::EventMetadata& md = metadata[e.metadata_id];
    std::span<const model::Stat> stats = l.stats_of(e);
    if (corr != nullptr)
      for (const model::Stat& st : stats)
        if (st.metadata_id == corr->id && st.kind == model::StatKind::kUint64) {
          o.raw(",\"cat\":\"gpu_launch\",\"bind_id\":");
          o.i64(static_cast<int64_t>(st.u64));
          o.ch(',');
          o.raw(flow);
        }
    if (!stats.empty() || !md.stats.empty()) WriteArgs(o, *info.plane, md, stats, scratch);
    o.ch('}');
  }
}

// Everything before the complete events: the document's head and the
// metadata events (process and thread names and sort order).
void WriteHead(JsonOut& o, const Doc& doc) {
  o.raw("{\"displayTimeUnit\":\"ns\",");
  if (!doc.options.perfetto) o.raw("\"metadata\":{\"highres-ticks\":true},");
  o.raw("\"traceEvents\":[");
  for (const Doc::PlaneInfo& info : doc.planes) {
    const model::Plane* p = info.plane;
    int64_t pid = info.pid;
    if (!p->name.empty()) {
      o.event("{\"ph\":\"M\",\"pid\":");
      o.i64(pid);
      o.raw(",\"name\":\"process_name\",\"args\":{\"name\":");
      o.str(p->name);
      o.raw("}}");
    }
    for (const model::Stat& s : p->stats) {
      if (s.kind == model::StatKind::kString && p->stat_name(s) == model::kProcessNameStat) {
        // Perfetto and chrome://tracing show labels beside the process name.
        o.event("{\"ph\":\"M\",\"pid\":");
        o.i64(pid);
        o.raw(",\"name\":\"process_labels\",\"args\":{\"labels\":");
        // The recorded process's pid, from the model (not the exporting process's).
        const int64_t os_pid = ProcessIdOf(*p);
        std::string name(p->stat_str(s));
        o.str(os_pid > 0 ? name + " (pid " + std::to_string(os_pid) + ")" : name);
        o.raw("}}");
      }
    }
    o.event("{\"ph\":\"M\",\"pid\":");
    o.i64(pid);
    o.raw(",\"name\":\"process_sort_index\",\"args\":{\"sort_index\":");
    o.i64(pid);
    o.raw("}}");
    int64_t sort_index = 0;
    for (const model::Line& l : p->lines) {
      if (l.name == kCounterLineName) continue;  // counters are process-level tracks, not threads
      uint32_t tid = static_cast<uint32_t>(l.display_id ? l.display_id : l.id);
      const std::string& name = l.display_name.empty() ? l.name : l.display_name;
      ++sort_index;
      if (!name.empty()) {
        o.event("{\"ph\":\"M\",\"pid\":");
        o.i64(pid);
        o.raw(",\"tid\":");
        o.u64(tid);
        o.raw(",\"name\":\"thread_name\",\"args\":{\"name\":");
        o.str(name);
        o.raw("}}");
      }
      o.event("{\"ph\":\"M\",\"pid\":");
      o.i64(pid);
      o.raw(",\"tid\":");
      o.u64(tid);
      o.raw(",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":");
      o.i64(p->name == model::kHostPlaneName || IsMergedHostPlane(*p) ? sort_index : int64_t{tid});
      o.raw("}}");
    }
  }
}

// What the recorder dropped is shown on the timeline, not only in a log.
void WriteTail(JsonOut& o, const Doc& doc) {
  if (const model::Plane* host = doc.space.find_plane(model::kHostPlaneName)) {
    for (const model::Stat& s : host->stats) {
      std::string what;
      if (host->stat_name(s) == model::kDroppedEventsStat && s.u64 > 0)
        what = " events dropped (buffer bound reached)";
      else if (host->stat_name(s) == model::kOverwrittenEventsStat && s.u64 > 0)
        what = " events overwritten by the flight recorder's ring (older ones first)";
      if (what.empty()) continue;
      o.event("{\"ph\":\"i\",\"s\":\"g\",\"pid\":");
      o.i64(kHostPid);
      o.raw(",\"tid\":0,\"ts\":0,\"name\":");
      o.str("spyglass: " + std::to_string(s.u64) + what);
      o.raw("}");
    }
  }
  o.raw("]}");
}

void WriteSlice(JsonOut& o, const Doc& doc, const Slice& slice, Scratch& scratch) {
  o.set_first(slice.first);
  switch (slice.kind) {
    case Slice::kHead: WriteHead(o, doc); break;
    case Slice::kEvents: {
      const Doc::PlaneInfo& info = doc.planes[slice.plane];
      WriteEvents(o, info, info.plane->lines[slice.line], slice.begin, slice.end, scratch);
      break;
    }
    case Slice::kCounters: {
      const Doc::PlaneInfo& info = doc.planes[slice.plane];
      WriteCounters(o, info, info.plane->lines[slice.line], slice.begin, slice.end);
      break;
    }
    case Slice::kTail: WriteTail(o, doc); break;
  }
}

// ---- gzip: one member, deflated in slices on several threads ------------------------

// Grows without zero-filling.
struct Bytes {
  std::unique_ptr<uint8_t[]> data;
  size_t size = 0, cap = 0;
  uint8_t* room(size_t n) {
    if (cap - size < n) {
      size_t c = std::max(size + n, 2 * cap);
      auto d = std::make_unique<uint8_t[]>(c);
      if (size) std::memcpy(d.get(), data.get(), size);
      data = std::move(d);
      cap = c;
    }
    return data.get() + size;
  }
};

// Deflates slices of one stream: each slice starts from a fresh state (no
// match reaches into the slice before, which another thread compresses) and
// ends with a sync flush (an empty stored block that ends it on a byte
// boundary), so the slices concatenate into one valid raw deflate stream.
// igzip at levels 1-3, zlib above or when asked.
class SliceDeflater {
 public:
  explicit SliceDeflater(const TraceJsonOptions& o) : zlib_(o.zlib || o.gzip_level > ISAL_DEF_MAX_LEVEL) {
    if (zlib_) {
      // Raw deflate (negative windowBits): the gzip header and trailer are written around the slices.
      ok_ = deflateInit2(&z_, std::clamp(o.gzip_level, 1, 9), Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK;
      return;
    }
    isal_deflate_init(&s_);
    s_.level = static_cast<uint32_t>(std::clamp(o.gzip_level, 1, ISAL_DEF_MAX_LEVEL));
    level_buf_.resize(s_.level == 1 ? ISAL_DEF_LVL1_DEFAULT : s_.level == 2 ? ISAL_DEF_LVL2_DEFAULT : ISAL_DEF_LVL3_DEFAULT);
    s_.level_buf = level_buf_.data();
    s_.level_buf_size = static_cast<uint32_t>(level_buf_.size());
    s_.gzip_flag = IGZIP_DEFLATE;
  }
  ~SliceDeflater() {
    if (zlib_ && ok_) deflateEnd(&z_);
  }
  SliceDeflater(const SliceDeflater&) = delete;
  SliceDeflater& operator=(const SliceDeflater&) = delete;

  bool ok() const { return ok_; }
  void Begin() {
    if (zlib_) deflateReset(&z_);
    else isal_deflate_reset(&s_);
  }
  // Appends the deflated [p, p + n) to `out`; `end` ends the slice.
  bool Add(const char* p, size_t n, bool end, Bytes& out) {
    size_t chunk = std::max<size_t>(n / 2, 64 << 10);  // output room per call; JSON deflates 5-7x
    if (zlib_) {
      z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(p));
      z_.avail_in = static_cast<uInt>(n);
      do {
        z_.next_out = out.room(chunk);
        z_.avail_out = static_cast<uInt>(chunk);
        int r = deflate(&z_, end ? Z_SYNC_FLUSH : Z_NO_FLUSH);
        if (r != Z_OK && r != Z_BUF_ERROR) return false;
        out.size += chunk - z_.avail_out;
      } while (z_.avail_out == 0);  // zlib's sign that it has more to write
      return true;
    }
    s_.next_in = reinterpret_cast<uint8_t*>(const_cast<char*>(p));
    s_.avail_in = static_cast<uint32_t>(n);
    s_.flush = end ? SYNC_FLUSH : NO_FLUSH;
    s_.end_of_stream = 0;
    do {
      s_.next_out = out.room(chunk);
      s_.avail_out = static_cast<uint32_t>(chunk);
      if (isal_deflate(&s_) != COMP_OK) return false;
      out.size += chunk - s_.avail_out;
      // A completed flush leaves igzip ready for a new block header.
    } while (s_.avail_in > 0 || s_.avail_out == 0 || (end && s_.internal_state.state != ZSTATE_NEW_HDR));
    return true;
  }

 private:
  bool zlib_;
  bool ok_ = true;
  z_stream z_{};
  isal_zstream s_{};
  std::vector<uint8_t> level_buf_;
};

int WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

// Workers format and deflate slices; the calling thread hands out slices and
// writes the finished ones in document order. 2 slots per worker are in
// flight at most (one being made, one waiting), so memory stays bounded
// whatever the model's size. Returns 0 or the errno of the failure.
int WriteGzipSlices(const Doc& doc, int fd, int threads) {
  struct Slot {
    Slice slice;
    Bytes z;             // the deflated slice
    uint32_t crc = 0;    // of the slice's JSON
    uint64_t bytes = 0;  // of JSON
    bool done = false;
    bool ok = true;
  };
  const size_t n_slots = 2 * static_cast<size_t>(threads);
  std::vector<Slot> slots(n_slots);
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  uint64_t queued = 0, taken = 0;  // slices handed out, slices taken by a worker
  bool stop = false;

  auto work = [&] {
    SliceDeflater deflater(doc.options);
    Scratch scratch;
    Slot* slot = nullptr;
    bool ok = true;
    // 128 KiB blocks: formatted and deflated while in the cache.
    JsonOut o(128 << 10, [&](const char* p, size_t n) {
      slot->crc = crc32_gzip_refl(slot->crc, reinterpret_cast<const uint8_t*>(p), n);
      slot->bytes += n;
      ok = ok && deflater.Add(p, n, false, slot->z);
      return ok;
    });
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        work_cv.wait(lock, [&] { return stop || taken < queued; });
        if (taken == queued) return;
        slot = &slots[taken++ % n_slots];
      }
      slot->z.size = 0;
      slot->crc = 0;
      slot->bytes = 0;
      ok = deflater.ok();
      deflater.Begin();
      WriteSlice(o, doc, slot->slice, scratch);
      o.flush();
      ok = ok && deflater.Add(nullptr, 0, true, slot->z);
      {
        std::lock_guard<std::mutex> lock(mu);
        slot->ok = ok;
        slot->done = true;
      }
      done_cv.notify_one();
    }
  };
  std::vector<std::thread> pool;
  JoinWorkers join(pool, mu, work_cv, stop);
  for (int i = 0; i < threads; ++i) pool.emplace_back(work);

  int err = WriteAll(fd, kGzipHeader, sizeof kGzipHeader);
  uLong crc = crc32(0, nullptr, 0);
  uint64_t total = 0, written = 0;
  auto write_oldest = [&] {
    Slot& s = slots[written % n_slots];
    {
      std::unique_lock<std::mutex> lock(mu);
      done_cv.wait(lock, [&] { return s.done; });
    }
    if (!s.ok) return ENOMEM;  // the deflater failed; it fails only to allocate
    if (int e = WriteAll(fd, s.z.data.get(), s.z.size)) return e;
    crc = crc32_combine(crc, s.crc, static_cast<z_off_t>(s.bytes));
    total += s.bytes;
    ++written;
    return 0;
  };
  if (err == 0) {
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
  }
  while (err == 0 && written < queued) err = write_oldest();
  if (err != 0) return err;
  // The last block: empty, fixed Huffman codes, BFINAL set (3 bits 1,1,0 and
  // the 7-bit end code); then the gzip trailer.
  uint8_t trailer[10] = {0x03, 0x00};
  GzipTrailer(static_cast<uint32_t>(crc), total, trailer + 2);
  return WriteAll(fd, trailer, sizeof trailer);
}

}  // namespace

uint64_t EstimateTraceJsonBytes(const model::Space& space, uint64_t stop_above) {
  const TraceJsonOptions options;
  const Doc doc(space, options);  // the per-event costs that also size the slices
  uint64_t total = 0;
  for (const Doc::PlaneInfo& info : doc.planes)
    for (const model::Line& l : info.plane->lines)
      for (const model::Event& e : l.events) {
        total += info.cost[e.metadata_id] + Doc::StatsBytes(*info.plane, l.stats_of(e));
        if (total > stop_above) return total;
      }
  return total;
}

bool StreamTraceJson(const model::Space& space, const TraceJsonOptions& options,
                     const std::function<bool(std::string_view)>& sink) {
  Doc doc(space, options);
  JsonOut o(1 << 20, [&](const char* p, size_t n) { return sink(std::string_view(p, n)); });
  Scratch scratch;
  ForEachSlice(doc, [&](const Slice& slice) {
    WriteSlice(o, doc, slice, scratch);
    return true;
  });
  return o.flush();
}

std::string TraceJsonString(const model::Space& space, const TraceJsonOptions& options) {
  std::string out;
  StreamTraceJson(space, options, [&](std::string_view s) {
    out.append(s);
    return true;
  });
  return out;
}

namespace {

// 0 or the errno of the failure.
int WriteTraceJsonGzFd(const model::Space& space, const TraceJsonOptions& options, int fd) {
  int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, kMaxTraceJsonThreads);
  Doc doc(space, options);
  return WriteGzipSlices(doc, fd, threads);
}

}  // namespace

Status WriteTraceJsonGz(const model::Space& space, const std::string& path, const TraceJsonOptions& options) {
  return WriteOutputFile(path, [&](int fd) { return WriteTraceJsonGzFd(space, options, fd); });
}

Status WriteTraceJsonGz(const model::Space& space, const OutputDir& dir, const std::string& name,
                        const TraceJsonOptions& options) {
  return dir.Write(name, [&](int fd) { return WriteTraceJsonGzFd(space, options, fd); });
}

}  // namespace spyglass::exporter
