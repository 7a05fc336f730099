#include "model/xspace_import.h"

#include <unordered_map>

#include "xplane.pb.h"

namespace spyglass::model {
namespace {

namespace tp = tensorflow::profiler;

// Proto stat-metadata ids of one plane -> names.
using StatNames = std::unordered_map<int64_t, const std::string*>;

bool ImportStat(const tp::XStat& in, const StatNames& names, Plane* plane, Stat* out) {
  auto key = names.find(in.metadata_id());
  if (key == names.end()) return false;
  const std::string& k = *key->second;
  switch (in.value_case()) {
    case tp::XStat::kDoubleValue: *out = plane->double_stat(k, in.double_value()); return true;
    case tp::XStat::kUint64Value: *out = plane->uint_stat(k, in.uint64_value()); return true;
    case tp::XStat::kInt64Value: *out = plane->int_stat(k, in.int64_value()); return true;
    case tp::XStat::kStrValue: *out = plane->str_stat(k, in.str_value()); return true;
    case tp::XStat::kBytesValue: *out = plane->bytes_stat(k, in.bytes_value()); return true;
    case tp::XStat::kRefValue: {
      auto v = names.find(static_cast<int64_t>(in.ref_value()));
      if (v == names.end()) return false;
      *out = plane->ref_stat(k, *v->second);
      return true;
    }
    default: return false;
  }
}

}  // namespace

void ImportXPlane(const tp::XPlane& in, Plane* out) {
  out->id = in.id();
  out->name = ValidUtf8(in.name());
  StatNames stat_names;
  for (const auto& [id, md] : in.stat_metadata()) stat_names[id] = &md.name();
  // Event metadata, interned by name; proto id -> model id.
  std::unordered_map<int64_t, uint32_t> event_ids;
  for (const auto& [id, md] : in.event_metadata()) {
    uint32_t mid = out->intern_event(md.name());
    event_ids[id] = mid;
    EventMetadata& m = out->event_metadata_at(mid);
    if (m.display_name.empty() && !md.display_name().empty()) m.display_name = ValidUtf8(md.display_name());
    for (const tp::XStat& s : md.stats()) {
      Stat st;
      if (ImportStat(s, stat_names, out, &st)) m.stats.push_back(std::move(st));
    }
  }
  for (const tp::XStat& s : in.stats()) {
    Stat st;
    if (ImportStat(s, stat_names, out, &st)) out->stats.push_back(std::move(st));
  }
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
    for (const tp::XEvent& e : l.events()) {
      Event ev;
      auto mid = event_ids.find(e.metadata_id());
      ev.metadata_id = mid != event_ids.end() ? mid->second : out->intern_event("(unknown event)");
      ev.offset_ps = e.data_case() == tp::XEvent::kOffsetPs ? e.offset_ps() : 0;
      ev.duration_ps = e.duration_ps();
      if (e.stats_size() > 0) {
        std::vector<Stat> stats;
        stats.reserve(e.stats_size());
        for (const tp::XStat& s : e.stats()) {
          Stat st;
          if (ImportStat(s, stat_names, out, &st)) stats.push_back(std::move(st));
        }
        if (!stats.empty()) {
          ev.stats = static_cast<uint32_t>(line.stat_lists.size());
          line.stat_lists.push_back(std::move(stats));
        }
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

Status ImportXSpaceBytes(const std::string& bytes, Space* out) {
  tp::XSpace space;
  if (!space.ParseFromString(bytes)) return InvalidArgumentError("the data is not a serialized XSpace");
  ImportXSpace(space, out);
  return Status::Ok();
}

}  // namespace spyglass::model
