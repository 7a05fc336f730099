#include "model/xspace_import.h"

#include <cstdint>
#include <unordered_map>
#include <unordered_set>

#include "common/utf8.h"
#include "model/wire.h"
#include "xplane.pb.h"

#include <google/protobuf/stubs/logging.h>

namespace spyglass::model {
namespace {

namespace tp = tensorflow::profiler;

// Proto stat-metadata ids of one plane -> model stat ids, interned on first
// use: a name referenced by many stats (keys, ref values) is hashed and stored
// once, however long it is.
class StatIds {
 public:
  StatIds(const tp::XPlane& in, Plane* plane) : in_(in), plane_(plane) {}
  bool find(int64_t proto_id, uint32_t* out) {
    auto [it, inserted] = ids_.try_emplace(proto_id, 0);
    if (inserted) {
      auto md = in_.stat_metadata().find(proto_id);
      it->second = md == in_.stat_metadata().end() ? 0 : plane_->intern_stat(md->second.name());
    }
    *out = it->second;
    return *out != 0;
  }

 private:
  const tp::XPlane& in_;
  Plane* plane_;
  std::unordered_map<int64_t, uint32_t> ids_;  // 0: no such metadata
};

bool ImportStat(const tp::XStat& in, StatIds& ids, Plane* plane, Stat* out) {
  if (!ids.find(in.metadata_id(), &out->metadata_id)) return false;
  switch (in.value_case()) {
    case tp::XStat::kDoubleValue: out->kind = StatKind::kDouble; out->f64 = in.double_value(); return true;
    case tp::XStat::kUint64Value: out->kind = StatKind::kUint64; out->u64 = in.uint64_value(); return true;
    case tp::XStat::kInt64Value: out->kind = StatKind::kInt64; out->i64 = in.int64_value(); return true;
    case tp::XStat::kStrValue:
      out->kind = StatKind::kString;
      out->str_index = plane->add_string(ValidUtf8(in.str_value()));
      return true;
    case tp::XStat::kBytesValue:
      out->kind = StatKind::kBytes;
      out->str_index = plane->add_string(in.bytes_value());
      return true;
    case tp::XStat::kRefValue: {
      uint32_t ref;
      if (in.ref_value() > static_cast<uint64_t>(INT64_MAX) || !ids.find(static_cast<int64_t>(in.ref_value()), &ref))
        return false;
      out->kind = StatKind::kRef;
      out->ref = ref;
      return true;
    }
    default: return false;
  }
}

}  // namespace

void ImportXPlane(const tp::XPlane& in, Plane* out) {
  out->id = in.id();
  out->name = ValidUtf8(in.name());
  StatIds stat_ids(in, out);
  // Event metadata, interned by name; proto id -> model id.
  std::unordered_map<int64_t, uint32_t> event_ids;
  for (const auto& [id, md] : in.event_metadata()) {
    uint32_t mid = out->intern_event(md.name());
    event_ids[id] = mid;
    EventMetadata& m = out->event_metadata_at(mid);
    if (m.display_name.empty() && !md.display_name().empty()) m.display_name = ValidUtf8(md.display_name());
    for (const tp::XStat& s : md.stats()) {
      Stat st;
      if (ImportStat(s, stat_ids, out, &st)) m.stats.push_back(st);
    }
  }
  // A stat whose value is an event metadata id (a CPU sample's stack node
  // names its caller's node, sampling/cpu_model.h): the proto's ids became
  // the model's above.
  std::unordered_set<uint32_t> remapped;
  for (const auto& [id, mid] : event_ids) {
    if (!remapped.insert(mid).second) continue;
    for (Stat& st : out->event_metadata_at(mid).stats)
      if (st.kind == StatKind::kUint64 && out->stat_name(st) == "cpu_stack_parent")
        if (auto it = event_ids.find(static_cast<int64_t>(st.u64)); it != event_ids.end()) st.u64 = it->second;
  }
  for (const tp::XStat& s : in.stats()) {
    Stat st;
    if (ImportStat(s, stat_ids, out, &st)) out->stats.push_back(st);
  }
  uint32_t unknown_event = 0;
  out->lines.reserve(out->lines.size() + in.lines_size());
  for (const tp::XLine& l : in.lines()) {
    Line& line = out->lines.emplace_back();
    line.id = l.id();
    line.display_id = l.display_id();
    line.name = ValidUtf8(l.name());
    line.display_name = ValidUtf8(l.display_name());
    line.timestamp_ns = l.timestamp_ns();
    line.duration_ps = l.duration_ps();
    line.events.reserve(l.events_size());
    size_t with_stats = 0, stats = 0;
    for (const tp::XEvent& e : l.events()) {
      with_stats += e.stats_size() > 0;
      stats += static_cast<size_t>(e.stats_size());
    }
    line.reserve_stats(with_stats, stats);
    for (const tp::XEvent& e : l.events()) {
      Event ev;
      auto mid = event_ids.find(e.metadata_id());
      if (mid != event_ids.end()) {
        ev.metadata_id = mid->second;
      } else {
        if (!unknown_event) unknown_event = out->intern_event("(unknown event)");
        ev.metadata_id = unknown_event;
      }
      ev.offset_ps = e.data_case() == tp::XEvent::kOffsetPs ? e.offset_ps() : 0;
      ev.duration_ps = e.duration_ps();
      for (const tp::XStat& s : e.stats()) {
        Stat st;
        if (ImportStat(s, stat_ids, out, &st)) line.add_stat(ev, st);
      }
      line.events.push_back(ev);
    }
  }
}

void ImportXSpace(const tp::XSpace& in, Space* out) {
  for (const tp::XPlane& p : in.planes()) {
    out->planes.emplace_back();
    ImportXPlane(p, &out->planes.back());
  }
  for (const auto& e : in.errors()) out->errors.push_back(e);
  for (const auto& w : in.warnings()) out->warnings.push_back(w);
  for (const auto& h : in.hostnames()) out->hostnames.push_back(h);
}

namespace {

// The messages of xplane.proto that hold strings, and the way to them.
enum class Msg { kNone, kSpace, kPlane, kLine, kEvent, kStat, kEventMdEntry, kStatMdEntry, kEventMd, kStatMd };

bool IsStringField(Msg m, uint32_t n) {
  switch (m) {
    case Msg::kSpace: return n == 2 || n == 3 || n == 4;  // errors, warnings, hostnames
    case Msg::kPlane: return n == 2;                      // name
    case Msg::kLine: return n == 2 || n == 11;            // name, display_name
    case Msg::kStat: return n == 5;                       // str_value
    case Msg::kEventMd: return n == 2 || n == 4;          // name, display_name
    case Msg::kStatMd: return n == 2 || n == 3;           // name, description
    default: return false;
  }
}

Msg ChildMessage(Msg m, uint32_t n) {
  switch (m) {
    case Msg::kSpace: return n == 1 ? Msg::kPlane : Msg::kNone;
    case Msg::kPlane:
      return n == 3   ? Msg::kLine
             : n == 4 ? Msg::kEventMdEntry
             : n == 5 ? Msg::kStatMdEntry
             : n == 6 ? Msg::kStat
                      : Msg::kNone;
    case Msg::kLine: return n == 4 ? Msg::kEvent : Msg::kNone;
    case Msg::kEvent: return n == 4 ? Msg::kStat : Msg::kNone;
    case Msg::kEventMdEntry: return n == 2 ? Msg::kEventMd : Msg::kNone;
    case Msg::kStatMdEntry: return n == 2 ? Msg::kStatMd : Msg::kNone;
    case Msg::kEventMd: return n == 5 ? Msg::kStat : Msg::kNone;
    default: return Msg::kNone;
  }
}

bool IsUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

bool Scrub(std::string_view msg, Msg m, std::string* out, size_t* replaced) {
  size_t pos = 0;
  uint32_t number, type;
  std::string_view payload;
  wire::Next n;
  while (true) {
    size_t start = pos;
    if ((n = wire::NextField(msg, &pos, &number, &type, &payload)) != wire::Next::kField) break;
    if (type == wire::kLengthDelimited && IsStringField(m, number) && !IsUtf8(payload)) {
      wire::PutLengthDelimited(number, ValidUtf8(payload), out);
      ++*replaced;
      continue;
    }
    if (Msg child = ChildMessage(m, number); type == wire::kLengthDelimited && child != Msg::kNone) {
      size_t before = *replaced;
      std::string inner;
      if (!Scrub(payload, child, &inner, replaced)) return false;
      if (*replaced != before) {
        wire::PutLengthDelimited(number, inner, out);
        continue;
      }
    }
    out->append(msg.substr(start, pos - start));  // as it was
  }
  return n == wire::Next::kEnd;
}

}  // namespace

bool ScrubInvalidUtf8(std::string_view bytes, std::string* out, size_t* replaced) {
  out->clear();
  *replaced = 0;
  return Scrub(bytes, Msg::kSpace, out, replaced);
}

std::string InvalidUtf8Warning(size_t replaced) {
  return std::to_string(replaced) + " strings of the profile (names, values) were not valid UTF-8: read with U+FFFD "
                                    "for each bad byte";
}

Status ImportXSpaceBytes(const std::string& bytes, Space* out, const XSpaceImportOptions& options) {
  if (bytes.size() > options.max_bytes)
    return InvalidArgumentError("the XSpace is too large: " + std::to_string(bytes.size()) +
                                " bytes exceed the limit of " + std::to_string(options.max_bytes >> 20) + " MiB");
  tp::XSpace space;
  size_t replaced = 0;
  bool parsed;
  {
    google::protobuf::LogSilencer quiet;  // a string that is not UTF-8 is handled below, not logged
    parsed = space.ParseFromString(bytes);
  }
  if (!parsed) {
    std::string clean;
    if (!ScrubInvalidUtf8(bytes, &clean, &replaced) || replaced == 0 || !space.ParseFromString(clean))
      return InvalidArgumentError("the data is not a serialized XSpace");
  }
  ImportXSpace(space, out);
  if (replaced) out->warnings.push_back(InvalidUtf8Warning(replaced));
  return Status::Ok();
}

}  // namespace spyglass::model
