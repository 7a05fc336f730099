#include "export/xplane/xplane_writer.h"

#include "export/output_file.h"


#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <span>
#include <string_view>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

namespace spyglass::exporter {
namespace {

using google::protobuf::io::CodedOutputStream;
using model::Stat;
using model::StatKind;

// Wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLen = 2;
constexpr uint32_t Tag(uint32_t field, uint32_t wire) { return (field << 3) | wire; }

[[gnu::always_inline]] inline size_t VarintSize(uint64_t v) { return CodedOutputStream::VarintSize64(v); }
[[gnu::always_inline]] inline size_t TagSize(uint32_t field) { return VarintSize(field << 3); }
[[gnu::always_inline]] inline size_t LenFieldSize(uint32_t field, size_t len) { return TagSize(field) + VarintSize(len) + len; }
[[gnu::always_inline]] inline size_t VarintFieldSize(uint32_t field, uint64_t v) { return TagSize(field) + VarintSize(v); }
// proto3: singular scalars equal to their default are not written.
[[gnu::always_inline]] inline size_t OptVarintFieldSize(uint32_t field, uint64_t v) { return v ? VarintFieldSize(field, v) : 0; }
size_t OptStringFieldSize(uint32_t field, const std::string& s) { return s.empty() ? 0 : LenFieldSize(field, s.size()); }

void WriteVarintField(CodedOutputStream& o, uint32_t field, uint64_t v) {
  o.WriteTag(Tag(field, kVarint));
  o.WriteVarint64(v);
}
void WriteOptVarintField(CodedOutputStream& o, uint32_t field, uint64_t v) {
  if (v) WriteVarintField(o, field, v);
}
void WriteStringField(CodedOutputStream& o, uint32_t field, std::string_view s) {
  o.WriteTag(Tag(field, kLen));
  o.WriteVarint64(s.size());
  o.WriteRaw(s.data(), static_cast<int>(s.size()));
}
void WriteOptStringField(CodedOutputStream& o, uint32_t field, const std::string& s) {
  if (!s.empty()) WriteStringField(o, field, s);
}
void WriteLenHeader(CodedOutputStream& o, uint32_t field, size_t len) {
  o.WriteTag(Tag(field, kLen));
  o.WriteVarint64(len);
}

// XStat: 1 metadata_id, oneof value {2 double, 3 uint64, 4 int64, 5 str, 6 bytes, 7 ref}.
[[gnu::always_inline]] inline size_t StatSize(const model::Plane& p, const Stat& s) {
  size_t n = OptVarintFieldSize(1, s.metadata_id);
  switch (s.kind) {
    case StatKind::kDouble: return n + TagSize(2) + 8;
    case StatKind::kUint64: return n + VarintFieldSize(3, s.u64);
    case StatKind::kInt64: return n + VarintFieldSize(4, static_cast<uint64_t>(s.i64));
    case StatKind::kString: return n + LenFieldSize(5, p.stat_str(s).size());
    case StatKind::kBytes: return n + LenFieldSize(6, p.stat_str(s).size());
    case StatKind::kRef: return n + VarintFieldSize(7, s.ref);
  }
  return n;
}

void WriteStat(CodedOutputStream& o, const model::Plane& p, uint32_t field, const Stat& s, size_t size) {
  WriteLenHeader(o, field, size);
  WriteOptVarintField(o, 1, s.metadata_id);
  switch (s.kind) {
    case StatKind::kDouble: {
      uint64_t bits;
      std::memcpy(&bits, &s.f64, 8);
      o.WriteTag(Tag(2, kFixed64));
      o.WriteLittleEndian64(bits);
      break;
    }
    case StatKind::kUint64: WriteVarintField(o, 3, s.u64); break;
    case StatKind::kInt64: WriteVarintField(o, 4, static_cast<uint64_t>(s.i64)); break;
    case StatKind::kString: WriteStringField(o, 5, p.stat_str(s)); break;
    case StatKind::kBytes: WriteStringField(o, 6, p.stat_str(s)); break;
    case StatKind::kRef: WriteVarintField(o, 7, s.ref); break;
  }
}

void WriteStat(CodedOutputStream& o, const model::Plane& p, uint32_t field, const Stat& s) {
  WriteStat(o, p, field, s, StatSize(p, s));
}

size_t StatsSize(const model::Plane& p, uint32_t field, std::span<const Stat> stats) {
  size_t n = 0;
  for (const Stat& s : stats) n += LenFieldSize(field, StatSize(p, s));
  return n;
}

// Time of an event from the start of its line's clock, in ps; 128 bits as a
// line timestamp in ns since the epoch times 1000 passes int64.
using Ps = __int128;
Ps EventTime(const model::Line& l, const model::Event& e) { return Ps(l.timestamp_ns) * 1000 + e.offset_ps; }
constexpr Ps kNoCut = ~(Ps(1) << 127);  // the largest value

// What is written: the model, less the events from `cut_ps` on when the
// whole would pass the size limit; then each plane that lost events says how
// many in the stat kDroppedStat, and the space holds `warning`.
constexpr std::string_view kDroppedStat = model::kDroppedOverSizeLimitStat;
struct View {
  Ps cut_ps = kNoCut;
  std::vector<uint64_t> dropped;  // per plane
  std::string warning;
  // Sizes computed once (one pass over the events), used when writing.
  std::vector<std::vector<size_t>> line_sizes;
  std::vector<size_t> plane_sizes;

  bool keep(const model::Line& l, const model::Event& e) const { return cut_ps == kNoCut || EventTime(l, e) < cut_ps; }
  bool lost(size_t plane) const { return plane < dropped.size() && dropped[plane] > 0; }
};

// The id of kDroppedStat in a plane that lost events: its own, or the next one.
uint64_t DroppedStatId(const model::Plane& p) {
  const model::StatMetadata* m = p.find_stat_metadata(kDroppedStat);
  return m ? static_cast<uint64_t>(m->id) : p.stat_metadata().size();
}
Stat DroppedStat(const model::Plane& p, uint64_t n) {
  Stat s;
  s.metadata_id = static_cast<uint32_t>(DroppedStatId(p));
  s.kind = StatKind::kUint64;
  s.u64 = n;
  return s;
}

// XEvent: 1 metadata_id, 2 offset_ps (oneof: written even when 0), 3 duration_ps, 4 stats.
size_t EventSize(const model::Plane& p, const model::Line& line, const model::Event& e) {
  return OptVarintFieldSize(1, e.metadata_id) + VarintFieldSize(2, static_cast<uint64_t>(e.offset_ps)) +
         OptVarintFieldSize(3, static_cast<uint64_t>(e.duration_ps)) + StatsSize(p, 4, line.stats_of(e));
}

// XLine: 1 id, 2 name, 3 timestamp_ns, 4 events, 9 duration_ps, 10 display_id, 11 display_name.
size_t LineHeaderSize(const model::Line& l) {
  return OptVarintFieldSize(1, static_cast<uint64_t>(l.id)) + OptStringFieldSize(2, l.name) +
         OptVarintFieldSize(3, static_cast<uint64_t>(l.timestamp_ns)) +
         OptVarintFieldSize(9, static_cast<uint64_t>(l.duration_ps)) +
         OptVarintFieldSize(10, static_cast<uint64_t>(l.display_id)) + OptStringFieldSize(11, l.display_name);
}
size_t LineSize(const model::Plane& p, const model::Line& l, const View& v) {
  size_t n = LineHeaderSize(l);
  for (const model::Event& e : l.events)
    if (v.keep(l, e)) n += LenFieldSize(4, EventSize(p, l, e));
  return n;
}

// XEventMetadata: 1 id, 2 name, 4 display_name, 5 stats.
size_t EventMetadataSize(const model::Plane& p, const model::EventMetadata& m) {
  return OptVarintFieldSize(1, static_cast<uint64_t>(m.id)) + OptStringFieldSize(2, m.name) +
         OptStringFieldSize(4, m.display_name) + StatsSize(p, 5, m.stats);
}
// Map entry: 1 key, 2 value.
size_t EventMetadataEntrySize(const model::Plane& p, const model::EventMetadata& m) {
  return OptVarintFieldSize(1, static_cast<uint64_t>(m.id)) + LenFieldSize(2, EventMetadataSize(p, m));
}
size_t StatMetadataSize(int64_t id, std::string_view name, const std::string& description) {
  return OptVarintFieldSize(1, static_cast<uint64_t>(id)) + (name.empty() ? 0 : LenFieldSize(2, name.size())) +
         OptStringFieldSize(3, description);
}
size_t StatMetadataEntrySize(int64_t id, std::string_view name, const std::string& description) {
  return OptVarintFieldSize(1, static_cast<uint64_t>(id)) + LenFieldSize(2, StatMetadataSize(id, name, description));
}
// The kDroppedStat metadata entry a plane needs, 0 if it has it already.
size_t ExtraStatMetadataSize(const model::Plane& p) {
  if (p.find_stat_metadata(kDroppedStat)) return 0;
  return LenFieldSize(5, StatMetadataEntrySize(DroppedStatId(p), kDroppedStat, {}));
}

// XPlane: 1 id, 2 name, 3 lines, 4 event_metadata, 5 stat_metadata, 6 stats.
// All but the lines.
size_t PlaneFixedSize(const model::Plane& p) {
  size_t n = OptVarintFieldSize(1, static_cast<uint64_t>(p.id)) + OptStringFieldSize(2, p.name);
  for (size_t i = 1; i < p.event_metadata().size(); ++i)
    n += LenFieldSize(4, EventMetadataEntrySize(p, p.event_metadata()[i]));
  for (size_t i = 1; i < p.stat_metadata().size(); ++i) {
    const auto& m = p.stat_metadata()[i];
    n += LenFieldSize(5, StatMetadataEntrySize(m.id, m.name, m.description));
  }
  n += StatsSize(p, 6, p.stats);
  return n;
}

// Fills the sizes of `v` for its cut; returns the size of the XSpace.
uint64_t Measure(const model::Space& space, View& v) {
  v.line_sizes.assign(space.planes.size(), {});
  v.plane_sizes.assign(space.planes.size(), 0);
  uint64_t total = 0;
  for (size_t i = 0; i < space.planes.size(); ++i) {
    const model::Plane& p = space.planes[i];
    size_t n = PlaneFixedSize(p);
    for (const model::Line& l : p.lines) {
      v.line_sizes[i].push_back(LineSize(p, l, v));
      n += LenFieldSize(3, v.line_sizes[i].back());
    }
    if (v.lost(i)) n += ExtraStatMetadataSize(p) + LenFieldSize(6, StatSize(p, DroppedStat(p, v.dropped[i])));
    v.plane_sizes[i] = n;
    total += LenFieldSize(1, n);
  }
  for (const auto& s : space.errors) total += LenFieldSize(2, s.size());
  for (const auto& s : space.warnings) total += LenFieldSize(3, s.size());
  if (!v.warning.empty()) total += LenFieldSize(3, v.warning.size());
  for (const auto& s : space.hostnames) total += LenFieldSize(4, s.size());
  return total;
}

// Chooses the cut for an XSpace of `total` bytes over `max_bytes`: the
// events from the latest time that leaves the rest under the limit on are
// left out, on every line alike, so that what remains is one consistent
// window from the start. Sizes are summed in time buckets (one pass); the
// cut falls on a bucket boundary, so the result may be a little under.
Status ChooseCut(const model::Space& space, uint64_t total, uint64_t max_bytes, View& v) {
  Ps lo = kNoCut, hi = -kNoCut;
  uint64_t events_bytes = 0, events = 0;
  for (const model::Plane& p : space.planes)
    for (const model::Line& l : p.lines)
      for (const model::Event& e : l.events) {
        Ps t = EventTime(l, e);
        lo = std::min(lo, t);
        hi = std::max(hi, t);
        events_bytes += LenFieldSize(4, EventSize(p, l, e));
        ++events;
      }
  // Room for what the cut adds (the warning, a stat and its metadata per
  // plane); length prefixes only shrink as events go.
  uint64_t reserve = 1024 + 64 * space.planes.size();
  uint64_t fixed = total - events_bytes;
  if (events == 0 || fixed + reserve >= max_bytes)
    return InvalidArgumentError("the XSpace passes the size limit of " + std::to_string(max_bytes) +
                                " bytes without any event (" + std::to_string(fixed) + " bytes of metadata)");
  uint64_t budget = max_bytes - fixed - reserve;
  constexpr size_t kBuckets = 1 << 16;
  std::vector<uint64_t> bytes(kBuckets, 0);
  Ps width = (hi - lo) / kBuckets + 1;
  for (const model::Plane& p : space.planes)
    for (const model::Line& l : p.lines)
      for (const model::Event& e : l.events)
        bytes[static_cast<size_t>((EventTime(l, e) - lo) / width)] += LenFieldSize(4, EventSize(p, l, e));
  size_t b = 0;
  for (uint64_t sum = 0; b < kBuckets && sum + bytes[b] <= budget; ++b) sum += bytes[b];
  v.cut_ps = lo + width * static_cast<Ps>(b);
  v.dropped.assign(space.planes.size(), 0);
  uint64_t dropped = 0;
  for (size_t i = 0; i < space.planes.size(); ++i)
    for (const model::Line& l : space.planes[i].lines)
      for (const model::Event& e : l.events)
        if (!v.keep(l, e)) ++v.dropped[i];
  for (uint64_t d : v.dropped) dropped += d;
  double kept_s = static_cast<double>(v.cut_ps - lo) * 1e-12;
  char kept[32];
  std::snprintf(kept, sizeof kept, "%.6f", kept_s);
  v.warning = "spyglass: the XSpace would be " + std::to_string(total) + " bytes, over protobuf's limit of " +
              std::to_string(max_bytes) + " bytes for one message: " + std::to_string(dropped) + " of " +
              std::to_string(events) + " events, all those from " + kept +
              " s after the first one on, were left out of it (counted in the plane stat " + std::string(kDroppedStat) +
              "); the trace JSON export keeps every event";
  return Status::Ok();
}

void WriteLine(CodedOutputStream& o, const model::Plane& p, const model::Line& l, size_t size, const View& v) {
  WriteLenHeader(o, 3, size);
  WriteOptVarintField(o, 1, static_cast<uint64_t>(l.id));
  WriteOptStringField(o, 2, l.name);
  WriteOptVarintField(o, 3, static_cast<uint64_t>(l.timestamp_ns));
  // Each event is encoded into a stack buffer with protobuf's array
  // encoders and handed over in one WriteRaw (the per-field stream calls cost
  // more than the encoding); an event too large for it takes the slow path.
  uint8_t buf[512];
  size_t stat_sizes[16];
  for (const model::Event& e : l.events) {
    if (!v.keep(l, e)) continue;
    std::span<const Stat> stats = l.stats_of(e);
    size_t size = OptVarintFieldSize(1, e.metadata_id) + VarintFieldSize(2, static_cast<uint64_t>(e.offset_ps)) +
                  OptVarintFieldSize(3, static_cast<uint64_t>(e.duration_ps));
    bool fast = stats.size() <= 16;
    for (size_t i = 0; i < stats.size(); ++i) {
      size_t n = StatSize(p, stats[i]);
      if (i < 16) stat_sizes[i] = n;
      fast = fast && stats[i].kind != StatKind::kString && stats[i].kind != StatKind::kBytes;
      size += LenFieldSize(4, n);
    }
    if (fast && size + 16 <= sizeof buf) {
      uint8_t* w = buf;
      w = CodedOutputStream::WriteVarint32ToArray(Tag(4, kLen), w);
      w = CodedOutputStream::WriteVarint64ToArray(size, w);
      if (e.metadata_id) w = CodedOutputStream::WriteVarint64ToArray(e.metadata_id, CodedOutputStream::WriteVarint32ToArray(Tag(1, kVarint), w));
      w = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(e.offset_ps), CodedOutputStream::WriteVarint32ToArray(Tag(2, kVarint), w));
      if (e.duration_ps) w = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(e.duration_ps), CodedOutputStream::WriteVarint32ToArray(Tag(3, kVarint), w));
      for (size_t i = 0; i < stats.size(); ++i) {
        const Stat& st = stats[i];
        w = CodedOutputStream::WriteVarint32ToArray(Tag(4, kLen), w);
        w = CodedOutputStream::WriteVarint64ToArray(stat_sizes[i], w);
        if (st.metadata_id) w = CodedOutputStream::WriteVarint64ToArray(st.metadata_id, CodedOutputStream::WriteVarint32ToArray(Tag(1, kVarint), w));
        switch (st.kind) {
          case StatKind::kDouble: {
            uint64_t bits;
            std::memcpy(&bits, &st.f64, 8);
            w = CodedOutputStream::WriteLittleEndian64ToArray(bits, CodedOutputStream::WriteVarint32ToArray(Tag(2, kFixed64), w));
            break;
          }
          case StatKind::kUint64: w = CodedOutputStream::WriteVarint64ToArray(st.u64, CodedOutputStream::WriteVarint32ToArray(Tag(3, kVarint), w)); break;
          case StatKind::kInt64: w = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(st.i64), CodedOutputStream::WriteVarint32ToArray(Tag(4, kVarint), w)); break;
          case StatKind::kRef: w = CodedOutputStream::WriteVarint64ToArray(st.ref, CodedOutputStream::WriteVarint32ToArray(Tag(7, kVarint), w)); break;
          default: break;
        }
      }
      o.WriteRaw(buf, static_cast<int>(w - buf));
      continue;
    }
    WriteLenHeader(o, 4, size);
    WriteOptVarintField(o, 1, e.metadata_id);
    WriteVarintField(o, 2, static_cast<uint64_t>(e.offset_ps));
    WriteOptVarintField(o, 3, static_cast<uint64_t>(e.duration_ps));
    for (size_t i = 0; i < stats.size(); ++i) WriteStat(o, p, 4, stats[i], i < 16 ? stat_sizes[i] : StatSize(p, stats[i]));
  }
  WriteOptVarintField(o, 9, static_cast<uint64_t>(l.duration_ps));
  WriteOptVarintField(o, 10, static_cast<uint64_t>(l.display_id));
  WriteOptStringField(o, 11, l.display_name);
}

void WriteStatMetadata(CodedOutputStream& o, int64_t id, std::string_view name, const std::string& description) {
  WriteLenHeader(o, 5, StatMetadataEntrySize(id, name, description));
  WriteOptVarintField(o, 1, static_cast<uint64_t>(id));
  WriteLenHeader(o, 2, StatMetadataSize(id, name, description));
  WriteOptVarintField(o, 1, static_cast<uint64_t>(id));
  if (!name.empty()) {
    o.WriteTag(Tag(2, kLen));
    o.WriteVarint64(name.size());
    o.WriteRaw(name.data(), static_cast<int>(name.size()));
  }
  WriteOptStringField(o, 3, description);
}

// The fields of a plane after its lines.
void WritePlaneTail(CodedOutputStream& o, const model::Plane& p, size_t index, const View& v) {
  for (size_t i = 1; i < p.event_metadata().size(); ++i) {
    const auto& m = p.event_metadata()[i];
    WriteLenHeader(o, 4, EventMetadataEntrySize(p, m));
    WriteOptVarintField(o, 1, static_cast<uint64_t>(m.id));
    WriteLenHeader(o, 2, EventMetadataSize(p, m));
    WriteOptVarintField(o, 1, static_cast<uint64_t>(m.id));
    WriteOptStringField(o, 2, m.name);
    WriteOptStringField(o, 4, m.display_name);
    for (const Stat& s : m.stats) WriteStat(o, p, 5, s);
  }
  for (size_t i = 1; i < p.stat_metadata().size(); ++i) {
    const auto& m = p.stat_metadata()[i];
    WriteStatMetadata(o, m.id, m.name, m.description);
  }
  bool lost = v.lost(index);
  if (lost && !p.find_stat_metadata(kDroppedStat))
    WriteStatMetadata(o, static_cast<int64_t>(DroppedStatId(p)), kDroppedStat, {});
  for (const Stat& s : p.stats) WriteStat(o, p, 6, s);
  if (lost) WriteStat(o, p, 6, DroppedStat(p, v.dropped[index]));
}

void WritePlane(CodedOutputStream& o, const model::Plane& p, size_t index, const View& v) {
  WriteLenHeader(o, 1, v.plane_sizes[index]);
  WriteOptVarintField(o, 1, static_cast<uint64_t>(p.id));
  WriteOptStringField(o, 2, p.name);
  for (size_t i = 0; i < p.lines.size(); ++i) WriteLine(o, p, p.lines[i], v.line_sizes[index][i], v);
  WritePlaneTail(o, p, index, v);
}

// XSpace: 1 planes, 2 errors, 3 warnings, 4 hostnames.
void WriteSpace(CodedOutputStream& o, const model::Space& space, const View& v) {
  for (size_t i = 0; i < space.planes.size(); ++i) WritePlane(o, space.planes[i], i, v);
  for (const auto& s : space.errors) WriteStringField(o, 2, s);
  for (const auto& s : space.warnings) WriteStringField(o, 3, s);
  if (!v.warning.empty()) WriteStringField(o, 3, v.warning);
  for (const auto& s : space.hostnames) WriteStringField(o, 4, s);
}

// One pass into memory, for a space that fits (most do): no walk to size
// the events first. Each length prefix is written in the width its
// message's size estimate needs, and the message is moved by the
// difference when the estimate was off (rare: one width covers a factor of
// 128). The bytes are those of the measured path, prefixes minimal.
// Sizes `s` to `n` bytes, its new storage advised as huge pages before the
// resize writes it (else it faults in 4 KiB pages).
void SizeFresh(std::string* s, size_t n) {
  if (n > s->capacity()) {
    s->reserve(n);
    model::AdviseHugePages(s->data() + s->size(), s->capacity() - s->size());
  }
  s->resize(n);
}

class OnePass {
 public:
  OnePass(std::string* out, uint64_t limit) : out_(out), limit_(limit) {}
  // Room for `n` bytes at the write position.
  [[gnu::always_inline]] uint8_t* Room(size_t n) {
    if (pos_ + n > out_->size()) Grow(pos_ + n);
    return base() + pos_;
  }
  void Done(uint8_t* end) { pos_ = static_cast<size_t>(end - base()); }
  void Append(const std::string& s) {
    std::memcpy(Room(s.size()), s.data(), s.size());
    pos_ += s.size();
  }
  struct Mark {
    size_t at, width;
  };
  // Opens a length-delimited field (number under 16: a one-byte tag).
  Mark Begin(uint32_t field, uint64_t estimate) {
    Mark m{pos_, VarintSize(estimate)};
    *Room(1 + m.width) = static_cast<uint8_t>(Tag(field, kLen));
    pos_ += 1 + m.width;
    return m;
  }
  void End(Mark m) {
    size_t body = m.at + 1 + m.width, len = pos_ - body, width = VarintSize(len);
    if (width != m.width) {
      Room(width);
      std::memmove(base() + m.at + 1 + width, base() + body, len);
      pos_ = m.at + 1 + width + len;
    }
    CodedOutputStream::WriteVarint64ToArray(len, base() + m.at + 1);
  }
  bool over() const { return pos_ > limit_; }
  void Finish() { out_->resize(pos_); }

 private:
  uint8_t* base() { return reinterpret_cast<uint8_t*>(out_->data()); }
  // By half, but not past the limit (what passes it is never kept).
  void Grow(size_t need) {
    uint64_t cap = std::max<uint64_t>(need, std::min<uint64_t>(limit_, uint64_t{1} << 62) + 1);
    SizeFresh(out_, std::min<uint64_t>(std::max(need, out_->size() + out_->size() / 2), cap));
  }
  std::string* out_;
  uint64_t limit_;
  size_t pos_ = 0;
};

[[gnu::always_inline]] inline uint8_t* PutTag(uint8_t* w, uint32_t field, uint32_t wire) {
  return CodedOutputStream::WriteVarint32ToArray(Tag(field, wire), w);
}
[[gnu::always_inline]] inline uint8_t* PutVarint(uint8_t* w, uint32_t field, uint64_t v) {
  return CodedOutputStream::WriteVarint64ToArray(v, PutTag(w, field, kVarint));
}
[[gnu::always_inline]] inline uint8_t* PutOptVarint(uint8_t* w, uint32_t field, uint64_t v) {
  return v ? PutVarint(w, field, v) : w;
}
inline uint8_t* PutString(uint8_t* w, uint32_t field, std::string_view s) {
  w = CodedOutputStream::WriteVarint64ToArray(s.size(), PutTag(w, field, kLen));
  std::memcpy(w, s.data(), s.size());
  return w + s.size();
}

[[gnu::always_inline]] inline uint8_t* PutStat(uint8_t* w, const model::Plane& p, const Stat& s, size_t size) {
  w = CodedOutputStream::WriteVarint64ToArray(size, PutTag(w, 4, kLen));
  w = PutOptVarint(w, 1, s.metadata_id);
  switch (s.kind) {
    case StatKind::kDouble: {
      uint64_t bits;
      std::memcpy(&bits, &s.f64, 8);
      return CodedOutputStream::WriteLittleEndian64ToArray(bits, PutTag(w, 2, kFixed64));
    }
    case StatKind::kUint64: return PutVarint(w, 3, s.u64);
    case StatKind::kInt64: return PutVarint(w, 4, static_cast<uint64_t>(s.i64));
    case StatKind::kString: return PutString(w, 5, p.stat_str(s));
    case StatKind::kBytes: return PutString(w, 6, p.stat_str(s));
    case StatKind::kRef: return PutVarint(w, 7, s.ref);
  }
  return w;
}

// False when the output passed the limit (the line is then not finished).
bool OnePassLine(OnePass& out, const model::Plane& p, const model::Line& l) {
  OnePass::Mark m = out.Begin(3, l.events.size() * 12 + l.stat_count() * 9 + 64);
  uint8_t* w = out.Room(32 + l.name.size());
  w = PutOptVarint(w, 1, static_cast<uint64_t>(l.id));
  if (!l.name.empty()) w = PutString(w, 2, l.name);
  out.Done(PutOptVarint(w, 3, static_cast<uint64_t>(l.timestamp_ns)));
  size_t stat_sizes[16];
  for (const model::Event& e : l.events) {
    std::span<const Stat> stats = l.stats_of(e);
    bool plain = true;
    for (const Stat& s : stats) plain &= s.kind != StatKind::kString && s.kind != StatKind::kBytes;
    if (plain) {
      // Encoded without sizing first: a one-byte length is reserved (a
      // stat's body is at most 17 bytes; an event's is under 128 unless it
      // has many stats, then it is moved by the extra bytes).
      uint8_t* start = out.Room(64 + 24 * stats.size());
      w = start + 2;
      w = PutOptVarint(w, 1, e.metadata_id);
      w = PutVarint(w, 2, static_cast<uint64_t>(e.offset_ps));
      w = PutOptVarint(w, 3, static_cast<uint64_t>(e.duration_ps));
      for (const Stat& s : stats) {
        uint8_t* body = w + 2;
        uint8_t* end = PutOptVarint(body, 1, s.metadata_id);
        switch (s.kind) {
          case StatKind::kDouble: {
            uint64_t bits;
            std::memcpy(&bits, &s.f64, 8);
            end = CodedOutputStream::WriteLittleEndian64ToArray(bits, PutTag(end, 2, kFixed64));
            break;
          }
          case StatKind::kUint64: end = PutVarint(end, 3, s.u64); break;
          case StatKind::kInt64: end = PutVarint(end, 4, static_cast<uint64_t>(s.i64)); break;
          case StatKind::kRef: end = PutVarint(end, 7, s.ref); break;
          default: break;
        }
        w[0] = static_cast<uint8_t>(Tag(4, kLen));
        w[1] = static_cast<uint8_t>(end - body);
        w = end;
      }
      size_t len = static_cast<size_t>(w - start - 2);
      start[0] = static_cast<uint8_t>(Tag(4, kLen));
      if (len < 128) {
        start[1] = static_cast<uint8_t>(len);
      } else {
        size_t width = VarintSize(len);
        std::memmove(start + 1 + width, start + 2, len);
        CodedOutputStream::WriteVarint64ToArray(len, start + 1);
        w = start + 1 + width + len;
      }
      out.Done(w);
      if (out.over()) return false;
      continue;
    }
    size_t size = OptVarintFieldSize(1, e.metadata_id) + VarintFieldSize(2, static_cast<uint64_t>(e.offset_ps)) +
                  OptVarintFieldSize(3, static_cast<uint64_t>(e.duration_ps));
    for (size_t i = 0; i < stats.size(); ++i) {
      size_t n = StatSize(p, stats[i]);
      if (i < 16) stat_sizes[i] = n;
      size += LenFieldSize(4, n);
    }
    w = out.Room(size + 16);
    w = CodedOutputStream::WriteVarint64ToArray(size, PutTag(w, 4, kLen));
    w = PutOptVarint(w, 1, e.metadata_id);
    w = PutVarint(w, 2, static_cast<uint64_t>(e.offset_ps));
    w = PutOptVarint(w, 3, static_cast<uint64_t>(e.duration_ps));
    for (size_t i = 0; i < stats.size(); ++i) w = PutStat(w, p, stats[i], i < 16 ? stat_sizes[i] : StatSize(p, stats[i]));
    out.Done(w);
    if (out.over()) return false;
  }
  w = out.Room(32 + l.display_name.size());
  w = PutOptVarint(w, 9, static_cast<uint64_t>(l.duration_ps));
  w = PutOptVarint(w, 10, static_cast<uint64_t>(l.display_id));
  if (!l.display_name.empty()) w = PutString(w, 11, l.display_name);
  out.Done(w);
  out.End(m);
  return true;
}

// Writes `space` whole into `out` in one pass; false (and `out` to be
// discarded) when it passes `max_bytes`: stopped as soon as it does, so the
// memory it took stays within the limit.
bool WriteOnePass(const model::Space& space, std::string* out, uint64_t max_bytes) {
  uint64_t estimate = 4096;
  for (const model::Plane& p : space.planes)
    for (const model::Line& l : p.lines) estimate += l.events.size() * 12 + l.stat_count() * 9 + 64;
  out->clear();
  SizeFresh(out, std::min<uint64_t>(estimate, std::min<uint64_t>(max_bytes, uint64_t{1} << 62) + 1));
  OnePass o(out, max_bytes);
  const View whole;
  for (size_t i = 0; i < space.planes.size(); ++i) {
    const model::Plane& p = space.planes[i];
    uint64_t plane_estimate = 64 * (p.event_metadata().size() + p.stat_metadata().size());
    for (const model::Line& l : p.lines) plane_estimate += l.events.size() * 12 + l.stat_count() * 9 + 64;
    OnePass::Mark m = o.Begin(1, plane_estimate);
    uint8_t* w = o.Room(16 + p.name.size());
    w = PutOptVarint(w, 1, static_cast<uint64_t>(p.id));
    if (!p.name.empty()) w = PutString(w, 2, p.name);
    o.Done(w);
    for (const model::Line& l : p.lines)
      if (!OnePassLine(o, p, l)) return false;
    // The metadata and plane stats (small: per distinct name) as the measured path writes them.
    std::string tail;
    {
      google::protobuf::io::StringOutputStream stream(&tail);
      CodedOutputStream c(&stream);
      WritePlaneTail(c, p, i, whole);
    }
    o.Append(tail);
    o.End(m);
    if (o.over()) return false;
  }
  std::string tail;
  {
    google::protobuf::io::StringOutputStream stream(&tail);
    CodedOutputStream c(&stream);
    for (const auto& s : space.errors) WriteStringField(c, 2, s);
    for (const auto& s : space.warnings) WriteStringField(c, 3, s);
    for (const auto& s : space.hostnames) WriteStringField(c, 4, s);
  }
  o.Append(tail);
  if (o.over()) return false;
  o.Finish();
  return true;
}

// What to write of `space` under the limit: all of it, or a cut (then
// said on stderr too).
Status Plan(const model::Space& space, const XSpaceWriteOptions& options, View& v) {
  uint64_t total = Measure(space, v);
  if (total <= options.max_bytes) return Status::Ok();
  if (Status s = ChooseCut(space, total, options.max_bytes, v); !s.ok()) return s;
  if (Measure(space, v) > options.max_bytes) return InternalError("the XSpace could not be cut under the size limit");
  std::fprintf(stderr, "%s\n", v.warning.c_str());
  return Status::Ok();
}

}  // namespace

Status SerializeXSpace(const model::Space& space, std::string* out, const XSpaceWriteOptions& options) {
  if (WriteOnePass(space, out, options.max_bytes)) return Status::Ok();
  // Over the limit: measured, then cut.
  out->clear();
  out->shrink_to_fit();
  View v;
  if (Status s = Plan(space, options, v); !s.ok()) return s;
  // One allocation (growing by doubling would copy and fault in the pages twice).
  size_t total = 0;
  for (size_t size : v.plane_sizes) total += LenFieldSize(1, size);
  out->reserve(total + 4096);
  model::AdviseHugePages(out->data(), out->capacity());
  google::protobuf::io::StringOutputStream stream(out);
  CodedOutputStream o(&stream);
  WriteSpace(o, space, v);
  return Status::Ok();
}

std::string SerializeXSpace(const model::Space& space) {
  std::string out;
  Status s = SerializeXSpace(space, &out, {});
  if (!s.ok()) std::fprintf(stderr, "spyglass: %s\n", s.message().c_str());
  return out;
}

namespace {

// Writes the planned view of `space` to `fd`; 0 or the errno of the failure.
int WriteXSpaceFd(const model::Space& space, const View& v, int fd) {
  google::protobuf::io::FileOutputStream stream(fd, 1 << 20);
  bool ok;
  {
    CodedOutputStream o(&stream);
    WriteSpace(o, space, v);
    ok = !o.HadError();
  }
  ok = stream.Flush() && ok;
  return ok ? 0 : (stream.GetErrno() ? stream.GetErrno() : EIO);
}

}  // namespace

Status WriteXSpaceFile(const model::Space& space, const std::string& path, const XSpaceWriteOptions& options) {
  View v;
  if (Status s = Plan(space, options, v); !s.ok())
    return Status(s.code(), "not writing " + path + ": " + s.message());
  return WriteOutputFile(path, [&](int fd) { return WriteXSpaceFd(space, v, fd); });
}

Status WriteXSpaceFile(const model::Space& space, const OutputDir& dir, const std::string& name,
                       const XSpaceWriteOptions& options) {
  View v;
  if (Status s = Plan(space, options, v); !s.ok())
    return Status(s.code(), "not writing " + dir.PathOf(name) + ": " + s.message());
  return dir.Write(name, [&](int fd) { return WriteXSpaceFd(space, v, fd); });
}

}  // namespace spyglass::exporter
