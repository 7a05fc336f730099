#include "export/xplane/xplane_writer.h"

#include "export/output_file.h"


#include <cerrno>
#include <cstring>

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

size_t VarintSize(uint64_t v) { return CodedOutputStream::VarintSize64(v); }
size_t TagSize(uint32_t field) { return VarintSize(field << 3); }
size_t LenFieldSize(uint32_t field, size_t len) { return TagSize(field) + VarintSize(len) + len; }
size_t VarintFieldSize(uint32_t field, uint64_t v) { return TagSize(field) + VarintSize(v); }
// proto3: singular scalars equal to their default are not written.
size_t OptVarintFieldSize(uint32_t field, uint64_t v) { return v ? VarintFieldSize(field, v) : 0; }
size_t OptStringFieldSize(uint32_t field, const std::string& s) { return s.empty() ? 0 : LenFieldSize(field, s.size()); }

void WriteVarintField(CodedOutputStream& o, uint32_t field, uint64_t v) {
  o.WriteTag(Tag(field, kVarint));
  o.WriteVarint64(v);
}
void WriteOptVarintField(CodedOutputStream& o, uint32_t field, uint64_t v) {
  if (v) WriteVarintField(o, field, v);
}
void WriteStringField(CodedOutputStream& o, uint32_t field, const std::string& s) {
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
size_t StatSize(const Stat& s) {
  size_t n = OptVarintFieldSize(1, s.metadata_id);
  switch (s.kind) {
    case StatKind::kDouble: return n + TagSize(2) + 8;
    case StatKind::kUint64: return n + VarintFieldSize(3, s.u64);
    case StatKind::kInt64: return n + VarintFieldSize(4, static_cast<uint64_t>(s.i64));
    case StatKind::kString: return n + LenFieldSize(5, s.str.size());
    case StatKind::kBytes: return n + LenFieldSize(6, s.str.size());
    case StatKind::kRef: return n + VarintFieldSize(7, s.ref);
  }
  return n;
}

void WriteStat(CodedOutputStream& o, uint32_t field, const Stat& s) {
  WriteLenHeader(o, field, StatSize(s));
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
    case StatKind::kString: WriteStringField(o, 5, s.str); break;
    case StatKind::kBytes: WriteStringField(o, 6, s.str); break;
    case StatKind::kRef: WriteVarintField(o, 7, s.ref); break;
  }
}

size_t StatsSize(uint32_t field, const std::vector<Stat>* stats) {
  size_t n = 0;
  if (stats)
    for (const Stat& s : *stats) n += LenFieldSize(field, StatSize(s));
  return n;
}

// XEvent: 1 metadata_id, 2 offset_ps (oneof: written even when 0), 3 duration_ps, 4 stats.
size_t EventSize(const model::Line& line, const model::Event& e) {
  return OptVarintFieldSize(1, e.metadata_id) + VarintFieldSize(2, static_cast<uint64_t>(e.offset_ps)) +
         OptVarintFieldSize(3, static_cast<uint64_t>(e.duration_ps)) + StatsSize(4, line.stats_of(e));
}

// XLine: 1 id, 2 name, 3 timestamp_ns, 4 events, 9 duration_ps, 10 display_id, 11 display_name.
size_t LineSize(const model::Line& l) {
  size_t n = OptVarintFieldSize(1, static_cast<uint64_t>(l.id)) + OptStringFieldSize(2, l.name) +
             OptVarintFieldSize(3, static_cast<uint64_t>(l.timestamp_ns)) +
             OptVarintFieldSize(9, static_cast<uint64_t>(l.duration_ps)) +
             OptVarintFieldSize(10, static_cast<uint64_t>(l.display_id)) + OptStringFieldSize(11, l.display_name);
  for (const model::Event& e : l.events) n += LenFieldSize(4, EventSize(l, e));
  return n;
}

// XEventMetadata: 1 id, 2 name, 4 display_name, 5 stats.
size_t EventMetadataSize(const model::EventMetadata& m) {
  return OptVarintFieldSize(1, static_cast<uint64_t>(m.id)) + OptStringFieldSize(2, m.name) +
         OptStringFieldSize(4, m.display_name) + StatsSize(5, &m.stats);
}
// Map entry: 1 key, 2 value.
size_t EventMetadataEntrySize(const model::EventMetadata& m) {
  return OptVarintFieldSize(1, static_cast<uint64_t>(m.id)) + LenFieldSize(2, EventMetadataSize(m));
}
size_t StatMetadataSize(const model::StatMetadata& m) {
  return OptVarintFieldSize(1, static_cast<uint64_t>(m.id)) + OptStringFieldSize(2, m.name) +
         OptStringFieldSize(3, m.description);
}
size_t StatMetadataEntrySize(const model::StatMetadata& m) {
  return OptVarintFieldSize(1, static_cast<uint64_t>(m.id)) + LenFieldSize(2, StatMetadataSize(m));
}

// XPlane: 1 id, 2 name, 3 lines, 4 event_metadata, 5 stat_metadata, 6 stats.
size_t PlaneSize(const model::Plane& p) {
  size_t n = OptVarintFieldSize(1, static_cast<uint64_t>(p.id)) + OptStringFieldSize(2, p.name);
  for (const model::Line& l : p.lines) n += LenFieldSize(3, LineSize(l));
  for (size_t i = 1; i < p.event_metadata().size(); ++i)
    n += LenFieldSize(4, EventMetadataEntrySize(p.event_metadata()[i]));
  for (size_t i = 1; i < p.stat_metadata().size(); ++i)
    n += LenFieldSize(5, StatMetadataEntrySize(p.stat_metadata()[i]));
  n += StatsSize(6, &p.stats);
  return n;
}

void WriteLine(CodedOutputStream& o, const model::Line& l) {
  WriteLenHeader(o, 3, LineSize(l));
  WriteOptVarintField(o, 1, static_cast<uint64_t>(l.id));
  WriteOptStringField(o, 2, l.name);
  WriteOptVarintField(o, 3, static_cast<uint64_t>(l.timestamp_ns));
  for (const model::Event& e : l.events) {
    WriteLenHeader(o, 4, EventSize(l, e));
    WriteOptVarintField(o, 1, e.metadata_id);
    WriteVarintField(o, 2, static_cast<uint64_t>(e.offset_ps));
    WriteOptVarintField(o, 3, static_cast<uint64_t>(e.duration_ps));
    if (const auto* stats = l.stats_of(e))
      for (const Stat& s : *stats) WriteStat(o, 4, s);
  }
  WriteOptVarintField(o, 9, static_cast<uint64_t>(l.duration_ps));
  WriteOptVarintField(o, 10, static_cast<uint64_t>(l.display_id));
  WriteOptStringField(o, 11, l.display_name);
}

void WritePlane(CodedOutputStream& o, const model::Plane& p) {
  WriteLenHeader(o, 1, PlaneSize(p));
  WriteOptVarintField(o, 1, static_cast<uint64_t>(p.id));
  WriteOptStringField(o, 2, p.name);
  for (const model::Line& l : p.lines) WriteLine(o, l);
  for (size_t i = 1; i < p.event_metadata().size(); ++i) {
    const auto& m = p.event_metadata()[i];
    WriteLenHeader(o, 4, EventMetadataEntrySize(m));
    WriteOptVarintField(o, 1, static_cast<uint64_t>(m.id));
    WriteLenHeader(o, 2, EventMetadataSize(m));
    WriteOptVarintField(o, 1, static_cast<uint64_t>(m.id));
    WriteOptStringField(o, 2, m.name);
    WriteOptStringField(o, 4, m.display_name);
    for (const Stat& s : m.stats) WriteStat(o, 5, s);
  }
  for (size_t i = 1; i < p.stat_metadata().size(); ++i) {
    const auto& m = p.stat_metadata()[i];
    WriteLenHeader(o, 5, StatMetadataEntrySize(m));
    WriteOptVarintField(o, 1, static_cast<uint64_t>(m.id));
    WriteLenHeader(o, 2, StatMetadataSize(m));
    WriteOptVarintField(o, 1, static_cast<uint64_t>(m.id));
    WriteOptStringField(o, 2, m.name);
    WriteOptStringField(o, 3, m.description);
  }
  for (const Stat& s : p.stats) WriteStat(o, 6, s);
}

// XSpace: 1 planes, 2 errors, 3 warnings, 4 hostnames.
void WriteSpace(CodedOutputStream& o, const model::Space& space) {
  for (const model::Plane& p : space.planes) WritePlane(o, p);
  for (const auto& s : space.errors) WriteStringField(o, 2, s);
  for (const auto& s : space.warnings) WriteStringField(o, 3, s);
  for (const auto& s : space.hostnames) WriteStringField(o, 4, s);
}

}  // namespace

std::string SerializeXSpace(const model::Space& space) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    CodedOutputStream o(&stream);
    WriteSpace(o, space);
  }
  return out;
}

namespace {

// 0 or the errno of the failure.
int WriteXSpaceFd(const model::Space& space, int fd) {
  google::protobuf::io::FileOutputStream stream(fd, 1 << 20);
  bool ok;
  {
    CodedOutputStream o(&stream);
    WriteSpace(o, space);
    ok = !o.HadError();
  }
  ok = stream.Flush() && ok;
  return ok ? 0 : (stream.GetErrno() ? stream.GetErrno() : EIO);
}

}  // namespace

Status WriteXSpaceFile(const model::Space& space, const std::string& path) {
  return WriteOutputFile(path, [&](int fd) { return WriteXSpaceFd(space, fd); });
}

Status WriteXSpaceFile(const model::Space& space, const OutputDir& dir, const std::string& name) {
  return dir.Write(name, [&](int fd) { return WriteXSpaceFd(space, fd); });
}

}  // namespace spyglass::exporter
