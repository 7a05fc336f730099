#include "model/xspace_import.h"

#include <cstdint>
#include <unordered_map>

#include "xplane.pb.h"

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

Status ImportXSpaceBytes(const std::string& bytes, Space* out, const XSpaceImportOptions& options) {
  if (bytes.size() > options.max_bytes)
    return InvalidArgumentError("the XSpace is too large: " + std::to_string(bytes.size()) +
                                " bytes exceed the limit of " + std::to_string(options.max_bytes >> 20) + " MiB");
  tp::XSpace space;
  if (!space.ParseFromString(bytes)) return InvalidArgumentError("the data is not a serialized XSpace");
  ImportXSpace(space, out);
  return Status::Ok();
}

}  // namespace spyglass::model
