#include "model/xspace.h"

#include <algorithm>
#include <charconv>

#include <sys/mman.h>

#include "common/utf8.h"

namespace spyglass::model {


std::string ValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len = Utf8SequenceLength(s, i);
    if (len == 0) {
      out += "\xef\xbf\xbd";
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

void AdviseHugePages(const void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (p == nullptr || bytes < 2 * kHuge) return;
  uintptr_t start = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
}

void Line::reserve_exact(size_t n_events, size_t stats) {
  events.reserve(events.size() + n_events);
  reserve_stats(n_events, stats);
  AdviseHugePages(events.data() + events.size(), n_events * sizeof(Event));
  AdviseHugePages(stat_ranges_.data() + stat_ranges_.size(), n_events * sizeof(StatRange));
  AdviseHugePages(stat_pool_.data() + stat_pool_.size(), stats * sizeof(Stat));
}

void Line::add_stat(Event& e, const Stat& s) {
  if (e.stats == kNoStats) {
    e.stats = static_cast<uint32_t>(stat_ranges_.size());
    stat_ranges_.push_back({static_cast<uint32_t>(stat_pool_.size()), 0});
  }
  StatRange& r = stat_ranges_[e.stats];
  if (r.first + r.count != stat_pool_.size()) {
    // Another event got stats since: move this list to the end.
    uint32_t first = static_cast<uint32_t>(stat_pool_.size());
    for (uint32_t i = 0; i < r.count; ++i) {
      Stat copy = stat_pool_[r.first + i];
      stat_pool_.push_back(copy);
    }
    r.first = first;
  }
  stat_pool_.push_back(s);
  ++r.count;
}

void Line::append(Line&& other) {
  uint32_t ranges = static_cast<uint32_t>(stat_ranges_.size()), pool = static_cast<uint32_t>(stat_pool_.size());
  for (Event e : other.events) {
    if (e.stats != kNoStats) e.stats += ranges;
    events.push_back(e);
  }
  for (StatRange r : other.stat_ranges_) stat_ranges_.push_back({r.first + pool, r.count});
  stat_pool_.insert(stat_pool_.end(), other.stat_pool_.begin(), other.stat_pool_.end());
  other.events = {};
  other.stat_ranges_ = {};
  other.stat_pool_ = {};
}

uint64_t Plane::adopt_strings(Plane& other) {
  uint64_t offset = strings_.size();
  for (std::string& s : other.strings_) strings_.push_back(std::move(s));
  other.strings_.clear();
  return offset;
}

void Line::sort_events() {
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.offset_ps != b.offset_ps) return a.offset_ps < b.offset_ps;
    return a.duration_ps > b.duration_ps;
  });
}

uint32_t Plane::intern_event(std::string_view name) {
  std::string key(name);
  auto it = event_ids_.find(key);
  if (it != event_ids_.end()) return it->second;
  uint32_t id = static_cast<uint32_t>(event_metadata_.size());
  event_metadata_.push_back(EventMetadata{id, ValidUtf8(name), {}, {}});
  event_ids_.emplace(std::move(key), id);
  return id;
}

uint32_t Plane::intern_stat(std::string_view name) {
  std::string key(name);
  auto it = stat_ids_.find(key);
  if (it != stat_ids_.end()) return it->second;
  uint32_t id = static_cast<uint32_t>(stat_metadata_.size());
  stat_metadata_.push_back(StatMetadata{id, ValidUtf8(name), {}});
  stat_ids_.emplace(std::move(key), id);
  return id;
}

const StatMetadata* Plane::find_stat_metadata(std::string_view name) const {
  auto it = stat_ids_.find(std::string(name));
  return it == stat_ids_.end() ? nullptr : &stat_metadata_[it->second];
}

Stat Plane::int_stat(std::string_view key, int64_t v) {
  Stat s;
  s.metadata_id = intern_stat(key);
  s.kind = StatKind::kInt64;
  s.i64 = v;
  return s;
}

Stat Plane::uint_stat(std::string_view key, uint64_t v) {
  Stat s;
  s.metadata_id = intern_stat(key);
  s.kind = StatKind::kUint64;
  s.u64 = v;
  return s;
}

Stat Plane::double_stat(std::string_view key, double v) {
  Stat s;
  s.metadata_id = intern_stat(key);
  s.kind = StatKind::kDouble;
  s.f64 = v;
  return s;
}

Stat Plane::str_stat(std::string_view key, std::string v) {
  Stat s;
  s.metadata_id = intern_stat(key);
  s.kind = StatKind::kString;
  s.str_index = add_string(ValidUtf8(v));
  return s;
}

Stat Plane::ref_stat(std::string_view key, std::string_view value) {
  Stat s;
  s.metadata_id = intern_stat(key);
  s.kind = StatKind::kRef;
  s.ref = intern_stat(value);
  return s;
}

Stat Plane::bytes_stat(std::string_view key, std::string v) {
  Stat s;
  s.metadata_id = intern_stat(key);
  s.kind = StatKind::kBytes;
  s.str_index = add_string(std::move(v));
  return s;
}

std::string Plane::stat_text(const Stat& s) const {
  char buf[64];
  switch (s.kind) {
    case StatKind::kInt64: return std::string(buf, std::to_chars(buf, buf + sizeof buf, s.i64).ptr);
    case StatKind::kUint64: return std::string(buf, std::to_chars(buf, buf + sizeof buf, s.u64).ptr);
    case StatKind::kDouble: return std::string(buf, std::to_chars(buf, buf + sizeof buf, s.f64).ptr);
    case StatKind::kString: return std::string(stat_str(s));
    case StatKind::kBytes: return "<opaque bytes>";
    case StatKind::kRef: return s.ref < stat_metadata_.size() ? stat_metadata_[s.ref].name : std::string();
  }
  return {};
}

Line& Plane::line_with_id(int64_t id) {
  for (Line& l : lines)
    if (l.id == id) return l;
  lines.emplace_back().id = id;
  return lines.back();
}

Plane* Space::find_plane(std::string_view name) {
  for (Plane& p : planes)
    if (p.name == name) return &p;
  return nullptr;
}

const Plane* Space::find_plane(std::string_view name) const {
  return const_cast<Space*>(this)->find_plane(name);
}

Plane& Space::plane(std::string_view name) {
  if (Plane* p = find_plane(name)) return *p;
  planes.emplace_back().name = std::string(name);
  planes.back().id = static_cast<int64_t>(planes.size() - 1);
  return planes.back();
}

uint64_t Space::event_count() const {
  uint64_t n = 0;
  for (const Plane& p : planes)
    for (const Line& l : p.lines) n += l.events.size();
  return n;
}

}  // namespace spyglass::model
