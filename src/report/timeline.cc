#include "report/timeline.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstring>

#include "common/saturate.h"
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

static_assert(std::endian::native == std::endian::little, "the page reads counter values as little-endian float64");
void PutF64(std::string* out, double v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out->append(b, 8);
}

void PutZigzag(std::string* out, int64_t v) {
  PutVarint(out, (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63));
}

int64_t FloorDiv(int64_t a, int64_t b) { return a / b - (a % b != 0 && (a < 0) != (b < 0)); }

// Nearest ns: starts and ends stay in order.
int64_t Ns(int64_t ps) {
  int64_t q = ps / 1000, r = ps % 1000;  // (no ps + 500: it overflows near INT64_MAX)
  return q + (r >= 500) - (r <= -500);
}

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

uint32_t TimelineBuilder::DetailId(std::string_view detail) {
  if (detail.empty()) return 0;
  if (detail.size() > kMaxDetailLength) {
    size_t n = kMaxDetailLength;
    while (n > 0 && (static_cast<unsigned char>(detail[n]) & 0xC0) == 0x80) --n;  // not inside a UTF-8 character
    detail = detail.substr(0, n);
  }
  auto it = detail_ids_.find(detail);
  if (it != detail_ids_.end()) return it->second;
  if (tl_.details.size() >= kMaxDetails || detail_bytes_ + detail.size() > kMaxDetailBytes) {
    ++tl_.hidden_details;
    return 0;
  }
  detail_bytes_ += detail.size();
  tl_.details.emplace_back(detail);
  return detail_ids_.emplace(std::string(detail), static_cast<uint32_t>(tl_.details.size())).first->second;
}

void TimelineBuilder::AddEvent(std::string_view name, int64_t start_ps, int64_t duration_ps, std::string_view detail) {
  // A name is kept (and hashed) up to kMaxNameLength bytes, with how many
  // more it had: a megabyte name on every event is neither hashed per event
  // nor drawn whole.
  std::string capped;
  if (name.size() > kMaxNameLength) {
    size_t n = kMaxNameLength;
    while (n > 0 && (static_cast<unsigned char>(name[n]) & 0xC0) == 0x80) --n;
    capped = std::string(name.substr(0, n)) + "...(+" + std::to_string(name.size() - n) + " bytes)";
    name = capped;
  }
  auto it = name_ids_.find(name);
  if (it == name_ids_.end()) {
    it = name_ids_.emplace(std::string(name), static_cast<uint32_t>(tl_.names.size())).first;
    tl_.names.emplace_back(name);
  }
  // Hostile times: no overflow past the end of int64.
  duration_ps = std::clamp<int64_t>(duration_ps, 0, INT64_MAX - std::max<int64_t>(start_ps, 0));
  spans_.push_back({start_ps, start_ps + duration_ps, it->second, 1, duration_ps, DetailId(detail)});
}

std::vector<TimelineBuilder::Span> TimelineBuilder::Merge(const std::vector<Span>& spans, int64_t threshold_ps) {
  std::vector<Span> out;
  for (const Span& s : spans) {
    // Only what would be under a pixel joins: two wide neighbours stay
    // apart however close (a step's forward and backward).
    if (!out.empty() && SaturatedSub(s.start, out.back().end) < threshold_ps &&
        (s.end - s.start < threshold_ps || out.back().end - out.back().start < threshold_ps)) {
      Span& m = out.back();
      m.end = std::max(m.end, s.end);
      m.count += s.count;
      m.detail = 0;
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
    PutZigzag(blob, start - prev_end);  // may round to -1
    PutVarint(blob, static_cast<uint64_t>(end - start));
    PutVarint(blob, s.name);
    PutVarint(blob, s.detail);
    if (threshold_ns > 0) PutVarint(blob, s.count);
    prev_end = end;
  }
  level.bytes = blob->size() - level.offset;
  return level;
}

void TimelineBuilder::AddLevels(const std::vector<Span>& lane, int64_t base_ns, std::vector<TimelineLevel>* levels) {
  levels->push_back(Encode(lane, 0, base_ns));
  if (lane.size() < 2) return;
  const int64_t extent_ns = Ns(lane.back().end) - Ns(lane.front().start);
  size_t kept = lane.size();
  std::vector<Span> current;
  // Each level starts from the one before (coarser still); the first from the lane itself (no copy).
  for (int64_t t = 16; t / 4 <= extent_ns && t < INT64_MAX / 4000; t *= 4) {
    current = Merge(current.empty() ? lane : current, t * 1000);
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
  // The lanes hold the spans now: freed before the levels are made (peak memory of a big line).
  spans_.clear();
  spans_.shrink_to_fit();
  for (std::vector<Span>& lane : lanes) {
    track.lanes.emplace_back();
    AddLevels(lane, base_ns, &track.lanes.back());
    lane.clear();
    lane.shrink_to_fit();
  }
  tl_.events += track.events;
  tl_.tracks.push_back(std::move(track));
  base_ns_.push_back(base_ns);
  spans_.clear();
  spans_.shrink_to_fit();
}

void TimelineBuilder::AddCounterSample(std::string_view plane, std::string_view name, int64_t time_ps, double value,
                                       bool bytes) {
  std::string key;
  key.reserve(plane.size() + 1 + name.size());
  key.append(plane).append(1, '\0').append(name);
  auto it = counter_index_.find(key);
  if (it == counter_index_.end()) {
    size_t index = SIZE_MAX;  // past kMaxCounters: counted, not kept
    if (tl_.counters.size() < kMaxCounters) {
      index = tl_.counters.size();
      TimelineCounter& c = tl_.counters.emplace_back();
      c.plane = plane;
      c.name = name;
      c.bytes = bytes;
      counter_samples_.emplace_back();
    } else {
      ++tl_.hidden_counters;
    }
    it = counter_index_.emplace(std::move(key), index).first;
  }
  if (it->second == SIZE_MAX || !std::isfinite(value)) {
    ++tl_.hidden_counter_samples;
    return;
  }
  counter_samples_[it->second].push_back({time_ps, value});
}

void TimelineBuilder::EncodeCounter(TimelineCounter& c, std::vector<Sample>& samples) {
  struct Point {
    int64_t ns;
    double lo, hi, last;
  };
  std::vector<Point> points;
  points.reserve(samples.size());
  for (const Sample& s : samples) points.push_back({Ns(s.ps), s.value, s.value, s.value});
  c.samples = samples.size();
  c.min = c.max = points.front().last;
  for (const Point& p : points) c.min = std::min(c.min, p.lo), c.max = std::max(c.max, p.hi);
  auto encode = [&](int64_t threshold_ns) {
    TimelineLevel level{threshold_ns, points.size(), tl_.blob.size(), 0};
    int64_t prev = points.front().ns;
    for (const Point& p : points) {
      PutZigzag(&tl_.blob, p.ns - prev);
      prev = p.ns;
      if (threshold_ns > 0) {
        PutF64(&tl_.blob, p.lo);
        PutF64(&tl_.blob, p.hi);
      }
      PutF64(&tl_.blob, p.last);
    }
    level.bytes = tl_.blob.size() - level.offset;
    c.levels.push_back(level);
  };
  encode(0);
  const int64_t extent_ns = points.back().ns - points.front().ns;
  size_t kept = points.size();
  // Buckets nest (each threshold is 4 times the last), so each level is
  // made from the one before.
  for (int64_t t = 16; kept > 1 && t / 4 <= extent_ns && t < INT64_MAX / 4; t *= 4) {
    size_t n = 0;
    for (size_t i = 0; i < points.size(); ++i) {
      if (n > 0 && FloorDiv(points[i].ns, t) == FloorDiv(points[n - 1].ns, t)) {
        Point& m = points[n - 1];
        m.lo = std::min(m.lo, points[i].lo);
        m.hi = std::max(m.hi, points[i].hi);
        m.last = points[i].last;
      } else {
        points[n++] = points[i];
      }
    }
    points.resize(n);
    if (n * 2 > kept) continue;
    encode(t);
    kept = n;
  }
}

Timeline TimelineBuilder::Finish() {
  EndLine();
  // Counters: samples in time order, empty ones (every value non-finite) dropped.
  int64_t start_ns = base_ns_.empty() ? INT64_MAX : *std::min_element(base_ns_.begin(), base_ns_.end());
  size_t kept = 0;
  for (size_t i = 0; i < tl_.counters.size(); ++i) {
    std::vector<Sample>& samples = counter_samples_[i];
    if (samples.empty()) continue;
    std::stable_sort(samples.begin(), samples.end(), [](const Sample& a, const Sample& b) { return a.ps < b.ps; });
    start_ns = std::min(start_ns, Ns(samples.front().ps));
    end_ps_ = std::max(end_ps_, samples.back().ps);
    if (kept != i) {
      tl_.counters[kept] = std::move(tl_.counters[i]);
      counter_samples_[kept] = std::move(samples);
    }
    ++kept;
  }
  tl_.counters.resize(kept);
  counter_samples_.resize(kept);
  if (start_ns == INT64_MAX) return std::move(tl_);
  tl_.start_ns = start_ns;
  for (size_t i = 0; i < tl_.tracks.size(); ++i) tl_.tracks[i].at_ns = base_ns_[i] - tl_.start_ns;
  tl_.duration_ns = Ns(end_ps_) - tl_.start_ns;
  for (size_t i = 0; i < tl_.counters.size(); ++i) {
    tl_.counters[i].at_ns = Ns(counter_samples_[i].front().ps) - tl_.start_ns;
    EncodeCounter(tl_.counters[i], counter_samples_[i]);
    counter_samples_[i] = {};
  }
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
