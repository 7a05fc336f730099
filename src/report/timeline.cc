#include "report/timeline.h"

#include <algorithm>
#include <climits>

#include "model/schema.h"

namespace spyglass::report {
namespace {

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Nearest ns: starts and ends stay in order.
int64_t Ns(int64_t ps) { return ps >= 0 ? (ps + 500) / 1000 : -((-ps + 500) / 1000); }

int PlaneOrder(std::string_view name) {
  if (name.substr(0, model::kHostPlaneName.size()) == model::kHostPlaneName) return 0;
  if (name.substr(0, 8) == "/device:") return 1;
  return 2;
}

}  // namespace

void TimelineBuilder::BeginLine(std::string_view plane, std::string_view line, int64_t id) {
  plane_ = plane;
  line_ = line;
  line_id_ = id;
  spans_.clear();
}

void TimelineBuilder::AddEvent(std::string_view name, int64_t start_ps, int64_t duration_ps) {
  auto it = name_ids_.find(name);
  if (it == name_ids_.end()) {
    it = name_ids_.emplace(std::string(name), static_cast<uint32_t>(tl_.names.size())).first;
    tl_.names.emplace_back(name);
  }
  // Hostile times: no overflow past the end of int64.
  duration_ps = std::clamp<int64_t>(duration_ps, 0, INT64_MAX - std::max<int64_t>(start_ps, 0));
  spans_.push_back({start_ps, start_ps + duration_ps, it->second, 1, duration_ps});
}

std::vector<TimelineBuilder::Span> TimelineBuilder::Merge(const std::vector<Span>& spans, int64_t threshold_ps) {
  std::vector<Span> out;
  for (const Span& s : spans) {
    // Only what would be under a pixel joins: two wide neighbours stay
    // apart however close (a step's forward and backward).
    if (!out.empty() && s.start - out.back().end < threshold_ps &&
        (s.end - s.start < threshold_ps || out.back().end - out.back().start < threshold_ps)) {
      Span& m = out.back();
      m.end = std::max(m.end, s.end);
      m.count += s.count;
      if (s.longest > m.longest) {
        m.longest = s.longest;
        m.name = s.name;
      }
    } else {
      out.push_back(s);
    }
  }
  return out;
}

TimelineLevel TimelineBuilder::Encode(const std::vector<Span>& spans, int64_t threshold_ns, int64_t base_ns) {
  std::string* blob = &tl_.blob;
  TimelineLevel level{threshold_ns, spans.size(), blob->size(), 0};
  int64_t prev_end = base_ns;
  for (const Span& s : spans) {
    int64_t start = Ns(s.start), end = Ns(s.end);
    int64_t gap = start - prev_end;  // may round to -1
    PutVarint(blob, (static_cast<uint64_t>(gap) << 1) ^ static_cast<uint64_t>(gap >> 63));
    PutVarint(blob, static_cast<uint64_t>(end - start));
    PutVarint(blob, s.name);
    if (threshold_ns > 0) PutVarint(blob, s.count);
    prev_end = end;
  }
  level.bytes = blob->size() - level.offset;
  return level;
}

void TimelineBuilder::AddLevels(const std::vector<Span>& lane, int64_t base_ns, std::vector<TimelineLevel>* levels) {
  levels->push_back(Encode(lane, 0, base_ns));
  if (lane.size() < 2) return;
  const int64_t extent_ns = Ns(lane.back().end - lane.front().start);
  size_t kept = lane.size();
  std::vector<Span> current = lane;
  // Each level starts from the one before (coarser still).
  for (int64_t t = 16; t / 4 <= extent_ns && t < INT64_MAX / 4000; t *= 4) {
    current = Merge(current, t * 1000);
    if (current.size() * 2 > kept) continue;
    levels->push_back(Encode(current, t, base_ns));
    if (current.size() <= 1) break;
    kept = current.size();
  }
}

void TimelineBuilder::EndLine() {
  if (spans_.empty()) return;
  // Parents before children, then one lane per depth: an event goes one
  // below its innermost open parent, or further down while that lane is
  // still busy (events that overlap without nesting).
  auto before = [](const Span& a, const Span& b) { return a.start != b.start ? a.start < b.start : a.end > b.end; };
  if (!std::is_sorted(spans_.begin(), spans_.end(), before)) std::sort(spans_.begin(), spans_.end(), before);
  TimelineTrack track;
  track.plane = plane_;
  track.name = line_;
  track.id = line_id_;
  track.events = spans_.size();
  std::vector<std::vector<Span>> lanes;
  std::vector<int64_t> lane_end;
  std::vector<std::pair<int64_t, size_t>> open;  // (end, lane) of enclosing events
  for (const Span& s : spans_) {
    while (!open.empty() && open.back().first <= s.start) open.pop_back();
    size_t d = open.empty() ? 0 : open.back().second + 1;
    while (d < lane_end.size() && lane_end[d] > s.start) ++d;
    if (d >= kMaxLanes) {
      ++track.hidden;
      continue;
    }
    if (d == lanes.size()) {
      lanes.emplace_back();
      lane_end.push_back(INT64_MIN);
    }
    lanes[d].push_back(s);
    lane_end[d] = s.end;
    open.emplace_back(s.end, d);
    end_ps_ = std::max(end_ps_, s.end);
  }
  const int64_t base_ns = Ns(spans_.front().start);
  for (const std::vector<Span>& lane : lanes) {
    track.lanes.emplace_back();
    AddLevels(lane, base_ns, &track.lanes.back());
  }
  tl_.events += track.events;
  tl_.tracks.push_back(std::move(track));
  base_ns_.push_back(base_ns);
  spans_.clear();
  spans_.shrink_to_fit();
}

Timeline TimelineBuilder::Finish() {
  EndLine();
  if (tl_.tracks.empty()) return std::move(tl_);
  tl_.start_ns = *std::min_element(base_ns_.begin(), base_ns_.end());
  for (size_t i = 0; i < tl_.tracks.size(); ++i) tl_.tracks[i].at_ns = base_ns_[i] - tl_.start_ns;
  tl_.duration_ns = Ns(end_ps_) - tl_.start_ns;
  if (tl_.tracks.size() > kMaxTracks) {
    // The busiest threads; the page says how many others there were.
    std::vector<size_t> order(tl_.tracks.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return tl_.tracks[a].events > tl_.tracks[b].events; });
    std::vector<bool> keep(order.size(), false);
    for (size_t i = 0; i < kMaxTracks; ++i) keep[order[i]] = true;
    std::vector<TimelineTrack> kept;
    for (size_t i = 0; i < tl_.tracks.size(); ++i) {
      if (keep[i]) {
        kept.push_back(std::move(tl_.tracks[i]));
      } else {
        ++tl_.hidden_tracks;
        tl_.hidden_track_events += tl_.tracks[i].events;
      }
    }
    tl_.tracks = std::move(kept);
  }
  std::stable_sort(tl_.tracks.begin(), tl_.tracks.end(), [](const TimelineTrack& a, const TimelineTrack& b) {
    return PlaneOrder(a.plane) < PlaneOrder(b.plane);
  });
  return std::move(tl_);
}

}  // namespace spyglass::report
