#include "model/xspace_import_chunked.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/utf8.h"

#include "model/wire.h"
#include "model/xspace_import.h"
#include "xplane.pb.h"

#include <google/protobuf/stubs/logging.h>

namespace spyglass::model {
namespace {

namespace tp = tensorflow::profiler;
using wire::kLengthDelimited;
using wire::Next;
using wire::NextField;
using wire::Split;

// Field numbers (xplane.proto).
constexpr uint32_t kSpacePlanes = 1;
constexpr uint32_t kPlaneLines = 3;
constexpr uint32_t kLineEvents = 4;
constexpr uint32_t kEventMetadataId = 1, kEventOffsetPs = 2, kEventDurationPs = 3, kEventStats = 4,
                   kEventNumOccurrences = 5;
constexpr uint32_t kStatMetadataId = 1, kStatDouble = 2, kStatUint64 = 3, kStatInt64 = 4, kStatStr = 5,
                   kStatBytes = 6, kStatRef = 7;

// Proto metadata ids of one plane -> model ids: dense for the small ids
// writers use, a map for the others. 0: no such metadata.
class IdMap {
 public:
  uint32_t* find(uint64_t id) {
    if (id < dense_.size()) return &dense_[id];
    auto it = sparse_.find(id);
    return it == sparse_.end() ? nullptr : &it->second;
  }
  uint32_t& at(uint64_t id) {
    if (id < kDense) {
      if (id >= dense_.size()) dense_.resize(id + 1, kUnset);
      return dense_[id];
    }
    return sparse_.try_emplace(id, kUnset).first->second;
  }
  static constexpr uint32_t kUnset = UINT32_MAX;

 private:
  static constexpr uint64_t kDense = 1 << 20;
  std::vector<uint32_t> dense_;
  std::unordered_map<uint64_t, uint32_t> sparse_;
};

bool IsUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// Decodes a plane's events straight from the wire into the model, with the
// ids its header gave (events are most of a profile: no message objects for
// them, so the peak is the bytes and the model). What protobuf rejects fails
// here too; fields of another wire type than the schema's are skipped as
// protobuf skips unknown fields.
class EventDecoder {
 public:
  EventDecoder(const tp::XPlane& header, Plane* plane) : header_(header), plane_(plane) {
    for (const auto& [id, md] : header.event_metadata()) events_.at(static_cast<uint64_t>(id)) = plane->intern_event(md.name());
  }

  bool DecodeLine(std::string_view bytes, model::Line* line) {
    size_t pos = 0;
    uint32_t number, type;
    std::string_view payload;
    uint64_t v;
    Next n;
    while ((n = NextField(bytes, &pos, &number, &type, &payload, &v)) == Next::kField) {
      if (number != kLineEvents || type != kLengthDelimited) continue;
      Event ev;
      if (!DecodeEvent(payload, line, &ev)) return false;
      line->events.push_back(ev);
    }
    return n == Next::kEnd;
  }

 private:
  bool DecodeEvent(std::string_view bytes, model::Line* line, model::Event* ev) {
    size_t pos = 0;
    uint32_t number, type;
    std::string_view payload;
    uint64_t v = 0, metadata_id = 0;
    Next n;
    while ((n = NextField(bytes, &pos, &number, &type, &payload, &v)) == Next::kField) {
      if (type == wire::kVarint) {
        switch (number) {
          case kEventMetadataId: metadata_id = v; break;
          case kEventOffsetPs: ev->offset_ps = static_cast<int64_t>(v); break;
          case kEventNumOccurrences: ev->offset_ps = 0; break;  // the other member of the `data` oneof
          case kEventDurationPs: ev->duration_ps = static_cast<int64_t>(v); break;
          default: break;
        }
      } else if (number == kEventStats && type == kLengthDelimited) {
        Stat st;
        bool keep;
        if (!DecodeStat(payload, &st, &keep)) return false;
        if (keep) line->add_stat(*ev, st);
      }
    }
    if (n != Next::kEnd) return false;
    uint32_t* mid = events_.find(metadata_id);
    if (mid != nullptr && *mid != IdMap::kUnset) {
      ev->metadata_id = *mid;
    } else {
      if (!unknown_event_) unknown_event_ = plane_->intern_event("(unknown event)");
      ev->metadata_id = unknown_event_;
    }
    return true;
  }

  // *keep: false for a stat the model leaves out (no such metadata, no value), as ImportXPlane.
  bool DecodeStat(std::string_view bytes, Stat* st, bool* keep) {
    size_t pos = 0;
    uint32_t number, type;
    std::string_view payload, text;
    uint64_t v = 0, metadata_id = 0, ref = 0;
    uint32_t value = 0;  // the oneof's field number, 0 if none
    Next n;
    while ((n = NextField(bytes, &pos, &number, &type, &payload, &v)) == Next::kField) {
      if (type == wire::kVarint) {
        switch (number) {
          case kStatMetadataId: metadata_id = v; break;
          case kStatUint64: value = number, st->u64 = v; break;
          case kStatInt64: value = number, st->i64 = static_cast<int64_t>(v); break;
          case kStatRef: value = number, ref = v; break;
          default: break;
        }
      } else if (type == wire::kFixed64 && number == kStatDouble) {
        value = number;
        std::memcpy(&st->f64, payload.data(), sizeof(double));
      } else if (type == kLengthDelimited && (number == kStatStr || number == kStatBytes)) {
        if (number == kStatStr && !IsUtf8(payload)) return false;  // proto3 strings must be UTF-8
        value = number;
        text = payload;
      }
    }
    if (n != Next::kEnd) return false;
    *keep = value != 0 && StatId(metadata_id, &st->metadata_id);
    if (!*keep) return true;
    switch (value) {
      case kStatDouble: st->kind = StatKind::kDouble; break;
      case kStatUint64: st->kind = StatKind::kUint64; break;
      case kStatInt64: st->kind = StatKind::kInt64; break;
      case kStatStr: st->kind = StatKind::kString, st->str_index = plane_->add_string(std::string(text)); break;
      case kStatBytes: st->kind = StatKind::kBytes, st->str_index = plane_->add_string(std::string(text)); break;
      case kStatRef: {
        uint32_t r;
        *keep = ref <= static_cast<uint64_t>(INT64_MAX) && StatId(ref, &r);
        st->kind = StatKind::kRef, st->ref = r;
        break;
      }
    }
    return true;
  }

  // The model id of a stat metadata id, interned on first use (as ImportXPlane).
  bool StatId(uint64_t id, uint32_t* out) {
    uint32_t& m = stats_.at(id);
    if (m == IdMap::kUnset) {
      auto md = header_.stat_metadata().find(static_cast<int64_t>(id));
      m = md == header_.stat_metadata().end() ? 0 : plane_->intern_stat(md->second.name());
    }
    *out = m;
    return m != 0;
  }

  const tp::XPlane& header_;
  Plane* plane_;
  IdMap events_, stats_;
  uint32_t unknown_event_ = 0;
};

Status ImportPlane(std::string_view bytes, Plane* out, const std::function<void(const char*)>& consumed) {
  const Status bad = InvalidArgumentError("the data is not a serialized XSpace");
  // The plane but its lines, and each line but its events: generated classes.
  std::string header;
  std::vector<std::string_view> lines;
  if (!Split(bytes, kPlaneLines, &header, &lines)) return bad;
  tp::XPlane plane;
  if (!plane.ParseFromString(header)) return bad;
  ImportXPlane(plane, out);
  EventDecoder decoder(plane, out);
  out->lines.reserve(lines.size());
  for (std::string_view l : lines) {
    // One pass for the line's fields but its events, and their count (a
    // vector grown by doubling would peak at 3x its size).
    std::string line_header;
    size_t events = 0, pos = 0;
    uint32_t number, type;
    std::string_view payload;
    Next n;
    while (true) {
      size_t start = pos;
      if ((n = NextField(l, &pos, &number, &type, &payload)) != Next::kField) break;
      if (number == kLineEvents && type == kLengthDelimited)
        ++events;
      else
        line_header.append(l.substr(start, pos - start));
    }
    if (n != Next::kEnd) return bad;
    tp::XLine xl;
    if (!xl.ParseFromString(line_header)) return bad;
    model::Line& line = out->lines.emplace_back();
    line.id = xl.id();
    line.display_id = xl.display_id();
    line.name = ValidUtf8(xl.name());
    line.display_name = ValidUtf8(xl.display_name());
    line.timestamp_ns = xl.timestamp_ns();
    line.duration_ps = xl.duration_ps();
    line.events.reserve(events);
    if (!decoder.DecodeLine(l, &line)) return bad;
    if (consumed) consumed(l.data() + l.size());
  }
  return Status::Ok();
}

Status ImportChunked(std::string_view bytes, Space* out, const std::function<void(const char*)>& consumed) {
  const Status bad = InvalidArgumentError("the data is not a serialized XSpace");
  std::string rest;
  std::vector<std::string_view> planes;
  if (!Split(bytes, kSpacePlanes, &rest, &planes)) return bad;
  tp::XSpace fields;  // errors, warnings, hostnames
  if (!fields.ParseFromString(rest)) return bad;
  Space space;
  for (std::string_view p : planes) {
    space.planes.emplace_back();
    if (Status s = ImportPlane(p, &space.planes.back(), consumed); !s.ok()) return s;
  }
  ImportXSpace(fields, &space);
  for (Plane& p : space.planes) out->planes.push_back(std::move(p));
  for (auto [from, to] : {std::pair{&space.errors, &out->errors}, std::pair{&space.warnings, &out->warnings},
                          std::pair{&space.hostnames, &out->hostnames}})
    to->insert(to->end(), from->begin(), from->end());
  return Status::Ok();
}

}  // namespace

Status ImportXSpaceBytesChunked(std::string_view bytes, Space* out, size_t /*chunk_bytes*/) {
  return ImportXSpaceBytesChunked(bytes, out, nullptr);
}

Status ImportXSpaceBytesChunked(std::string_view bytes, Space* out,
                                const std::function<void(const char* done_before)>& consumed) {
  Status s;
  {
    google::protobuf::LogSilencer quiet;  // a string that is not UTF-8 is handled below, not logged
    s = ImportChunked(bytes, out, consumed);
  }
  // What the caller released cannot be read again: it retries without.
  if (s.ok() || consumed) return s;
  // Strings that are not UTF-8 (what protobuf refuses): read as
  // ImportXSpaceBytes and `spyglass summary` read them, with a warning.
  std::string clean;
  size_t replaced = 0;
  if (!ScrubInvalidUtf8(bytes, &clean, &replaced) || replaced == 0) return s;
  if (!ImportChunked(clean, out, nullptr).ok()) return s;
  out->warnings.push_back(InvalidUtf8Warning(replaced));
  return Status::Ok();
}

}  // namespace spyglass::model
