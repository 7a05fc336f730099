#include "report/timeline.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstring>

#include "common/saturate.h"
#include "common/utf8.h"
#include "model/schema.h"
#include "model/wire.h"

namespace spyglass::report {
namespace {

// The page's varints: the model's writer (model/wire.h).
void PutVarint(std::string* out, uint64_t v) { model::wire::PutVarint(v, out); }

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

int PlaneOrder(std::string_view name);

// A lane's level decoded (times in ns from its track's at_ns), merged at
// another threshold and encoded again: the coarsening's level in between.
struct PlainSpan {
  int64_t start, end;
  uint64_t name, detail, count;
  int64_t longest;
};

uint64_t GetVarint(const std::string& b, size_t* p) {
  uint64_t v = 0;
  for (int shift = 0; *p < b.size() && shift < 64; shift += 7) {
    uint8_t c = static_cast<uint8_t>(b[(*p)++]);
    v |= uint64_t{c & 127u} << shift;
    if (!(c & 128)) break;
  }
  return v;
}

std::vector<PlainSpan> DecodeLevel(const std::string& blob, const TimelineLevel& l) {
  std::vector<PlainSpan> out;
  out.reserve(l.spans);
  size_t p = l.offset;
  int64_t prev = 0;
  for (uint64_t i = 0; i < l.spans; ++i) {
    uint64_t z = GetVarint(blob, &p);
    PlainSpan s;
    s.start = prev + static_cast<int64_t>(z >> 1 ^ (~(z & 1) + 1));
    s.end = s.start + static_cast<int64_t>(GetVarint(blob, &p));
    s.name = GetVarint(blob, &p);
    s.detail = GetVarint(blob, &p);
    s.count = l.threshold_ns > 0 ? GetVarint(blob, &p) : 1;
    s.longest = s.end - s.start;
    prev = s.end;
    out.push_back(s);
  }
  return out;
}

std::vector<PlainSpan> MergePlain(const std::vector<PlainSpan>& spans, int64_t t) {
  std::vector<PlainSpan> out;
  for (const PlainSpan& s : spans) {
    if (!out.empty() && s.start - out.back().end < t && (s.end - s.start < t || out.back().end - out.back().start < t)) {
      PlainSpan& m = out.back();
      m.end = std::max(m.end, s.end);
      m.count += s.count;
      m.detail = 0;
      if (s.longest > m.longest) m.longest = s.longest, m.name = s.name;
    } else {
      out.push_back(s);
    }
  }
  return out;
}

TimelineLevel EncodePlain(const std::vector<PlainSpan>& spans, int64_t threshold_ns, std::string* blob) {
  TimelineLevel level{threshold_ns, spans.size(), blob->size(), 0, {}, {}};
  int64_t prev = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const PlainSpan& s = spans[i];
    if (spans.size() > kChunkSpans && i % kChunkSpans == 0) {
      level.marks.push_back(static_cast<int64_t>(blob->size() - level.offset));
      level.marks.push_back(prev);
    }
    PutZigzag(blob, s.start - prev);
    PutVarint(blob, static_cast<uint64_t>(s.end - s.start));
    PutVarint(blob, s.name);
    PutVarint(blob, s.detail);
    PutVarint(blob, s.count);
    prev = s.end;
  }
  level.bytes = blob->size() - level.offset;
  return level;
}


int PlaneOrder(std::string_view name) {
  if (name.substr(0, model::kHostPlaneName.size()) == model::kHostPlaneName) return 0;
  if (name.substr(0, 8) == "/device:") return 1;
  return 2;
}

}  // namespace

void TimelineBuilder::BeginLine(std::string_view plane, std::string_view line, int64_t id, bool sorted) {
  plane_ = plane;
  line_ = line;
  line_id_ = id;
  spans_.clear();
  links_.clear();
  streaming_line_ = sink_ != nullptr && sorted;
  track_ = {};
}

uint32_t TimelineBuilder::DetailId(std::string_view detail) {
  if (detail.empty()) return 0;
  detail = Utf8Prefix(detail, kMaxDetailLength);
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

uint32_t TimelineBuilder::NameId(std::string_view name) {
  auto it = name_ids_.find(name);
  if (it == name_ids_.end()) {
    // Past the names' budget, every new name is one (counted): a run of
    // millions of distinct names keeps a page of bounded size.
    static constexpr std::string_view kOther = "(names past the page's budget)";
    if (name_bytes_ + name.size() > kMaxNameBytes) {
      ++tl_.hidden_names;
      name = kOther;
      it = name_ids_.find(name);
    }
    if (it == name_ids_.end()) {
      name_bytes_ += name.size();
      it = name_ids_.emplace(std::string(name), static_cast<uint32_t>(tl_.names.size())).first;
      tl_.names.emplace_back(name);
      tl_.name_events.push_back(0);
    }
    if (name == kOther) return it->second;  // each such event is counted: not remembered
  }
  RecentName& r = recent_names_[next_recent_++ % recent_names_.size()];
  r.name.assign(name);
  r.id = it->second;
  return it->second;
}

void TimelineBuilder::AddEvent(std::string_view name, int64_t start_ps, int64_t duration_ps, std::string_view detail,
                               uint64_t flow, uint64_t consumes, uint64_t produces) {
  // A name is kept (and hashed) up to kMaxNameLength bytes, with how many
  // more it had: a megabyte name on every event is neither hashed per event
  // nor drawn whole.
  std::string capped;
  if (name.size() > kMaxNameLength) {
    capped = Utf8Capped(name, kMaxNameLength);
    name = capped;
  }
  // Most lines repeat a few names: the last ones found are checked before the hash.
  uint32_t name_id = UINT32_MAX;
  for (const RecentName& r : recent_names_)
    if (r.id != UINT32_MAX && r.name == name) {
      name_id = r.id;
      break;
    }
  if (name_id == UINT32_MAX) name_id = NameId(name);
  ++tl_.name_events[name_id];
  // Hostile times: no overflow past the end of int64.
  duration_ps = std::clamp<int64_t>(duration_ps, 0, INT64_MAX - std::max<int64_t>(start_ps, 0));
  Span span{start_ps, start_ps + duration_ps, name_id, 1, duration_ps, DetailId(detail), 0};
  const Links links{flow, consumes, produces};
  const bool linked = (flow | consumes | produces) != 0;
  if (!streaming_line_) {
    if (linked) {
      links_.push_back(links);
      span.links = static_cast<uint32_t>(links_.size());
    }
    spans_.push_back(span);
    return;
  }
  if (track_.events > 0 &&
      (span.start < last_.start || (span.start == last_.start && span.end > last_.end))) {
    ++track_.events;  // out of order after all: counted, not drawn
    ++track_.hidden;
    ++out_of_order_;
    return;
  }
  last_ = span;
  StreamSpan(span, linked ? &links : nullptr);
}

int TimelineBuilder::Place(const Span& s, const Links* links) {
  if (track_.events++ == 0) {
    track_.plane = plane_;
    track_.name = line_;
    track_.id = line_id_;
    lane_end_.clear();
    open_.clear();
  }
  while (!open_.empty() && open_.back().first <= s.start) open_.pop_back();
  size_t d = open_.empty() ? 0 : open_.back().second + 1;
  while (d < lane_end_.size() && lane_end_[d] > s.start) ++d;
  if (d >= kMaxLanes) {
    ++track_.hidden;
    return -1;
  }
  if (d == lane_end_.size()) lane_end_.push_back(INT64_MIN);
  lane_end_[d] = s.end;
  if (links != nullptr) {
    if (links->flow != 0) AddFlowEnd(links->flow, static_cast<uint32_t>(d), s.start);
    if (links->consumes != 0) AddFlowEnd(links->consumes, static_cast<uint32_t>(d), s.start);
    if (links->produces != 0 && links->produces != links->consumes)
      AddFlowEnd(links->produces, static_cast<uint32_t>(d), s.start);
  }
  open_.emplace_back(s.end, d);
  end_ps_ = std::max(end_ps_, s.end);
  return static_cast<int>(d);
}

void TimelineBuilder::AddFlowEnd(uint64_t flow, uint32_t lane, int64_t start_ps) {
  // Two events of one id: an arrow from the earlier; a third continues from the second.
  FlowEnd here{static_cast<uint32_t>(tl_.tracks.size()), lane, Ns(start_ps)};
  // Ids seen once are held until their partner comes: bounded, so that
  // millions of kernels without their launches hold little.
  auto at = open_flows_.find(flow);
  bool first = at == open_flows_.end();
  if (first && open_flows_.size() < kMaxOpenFlows && raw_flows_.size() < kMaxFlows) open_flows_.emplace(flow, here);
  if (!first) {
    if (raw_flows_.size() < kMaxFlows) {
      bool in_order = at->second.ns <= here.ns;
      raw_flows_.push_back({in_order ? at->second : here, in_order ? here : at->second});
    } else {
      ++tl_.hidden_flows;
    }
    at->second = here;
  }
}

// Thresholds of the streamed levels: as AddLevels, 16 ns, then 4 times the last.
constexpr size_t kMaxStages = [] {
  size_t n = 1;
  for (int64_t t = 16; t < INT64_MAX / 4000; t *= 4) ++n;
  return n;
}();

void TimelineBuilder::StreamSpan(const Span& s, const Links* links) {
  if (track_.events == 0) {
    line_base_ns_ = Ns(s.start);
    stream_lanes_.clear();
  }
  int d = Place(s, links);
  if (d < 0) return;
  if (static_cast<size_t>(d) == stream_lanes_.size()) {
    StreamLane& lane = stream_lanes_.emplace_back();
    lane.stages.reserve(kMaxStages);  // Feed holds references across its growth
    lane.stages.emplace_back().prev_end_ns = line_base_ns_;
    lane.first_start = s.start;
  }
  StreamLane& lane = stream_lanes_[static_cast<size_t>(d)];
  lane.last_end = s.end;
  EncodeStaged(lane.stages[0], s);
  Feed(lane, 1, s);
}

void TimelineBuilder::Feed(StreamLane& lane, size_t stage, const Span& s) {
  if (stage >= kMaxStages) return;
  if (stage == lane.stages.size()) {
    Stage& st = lane.stages.emplace_back();
    st.threshold_ns = int64_t{16} << (2 * (stage - 1));
    st.prev_end_ns = line_base_ns_;
    st.lazy = sink_->Readable();
  }
  Stage& st = lane.stages[stage];
  const int64_t t = st.threshold_ns * 1000;
  if (!st.has_pending) {
    st.pending = s;
    st.has_pending = true;
    return;
  }
  Span& m = st.pending;
  // As Merge: only what would be under a pixel joins.
  if (SaturatedSub(s.start, m.end) < t && (s.end - s.start < t || m.end - m.start < t)) {
    m.end = std::max(m.end, s.end);
    m.count += s.count;
    m.detail = 0;
    if (s.longest > m.longest) {
      m.longest = s.longest;
      m.name = s.name;
    }
    if (st.lazy) Materialize(lane, stage);
    return;
  }
  const Span done = m;
  m = s;
  Emit(st, done);
  Feed(lane, stage + 1, done);
}

void TimelineBuilder::Emit(Stage& st, const Span& s) {
  if (st.lazy) {
    ++st.spans;  // the level below's span, encoded there
    return;
  }
  EncodeStaged(st, s);
}

void TimelineBuilder::Materialize(StreamLane& lane, size_t stage) {
  Stage& st = lane.stages[stage];
  // Its spans so far are the first ones of the nearest level below that is
  // encoded (the events' level is): decoded from there and encoded again
  // with this level's fields, as EncodeStaged would have.
  size_t b = stage - 1;
  while (lane.stages[b].lazy) --b;
  const Stage& base = lane.stages[b];
  const uint64_t n = st.spans;
  st.lazy = false;
  st.spans = 0;
  st.prev_end_ns = line_base_ns_;
  int64_t prev = line_base_ns_;
  auto decode = [&](std::string_view bytes) {
    const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
    const uint8_t* end = p + bytes.size();
    auto get = [&]() {
      uint64_t v = 0;
      for (int shift = 0; p < end && shift < 64; shift += 7) {
        const uint8_t c = *p++;
        v |= uint64_t{c & 127u} << shift;
        if (!(c & 128)) break;
      }
      return v;
    };
    while (p < end && st.spans < n) {
      const uint64_t z = get();
      const int64_t start = prev + (static_cast<int64_t>(z >> 1) ^ -static_cast<int64_t>(z & 1));
      const int64_t stop = start + static_cast<int64_t>(get());
      const uint64_t name = get(), detail = get(), count = base.threshold_ns > 0 ? get() : 1;
      EncodeNs(st, start, stop, name, detail, count);
      prev = stop;
    }
  };
  std::string chunk;
  for (const TimelineChunk& c : base.chunks) {
    if (st.spans >= n) break;
    if (!sink_->Read(c.offset, c.bytes, &chunk)) return;  // the sink keeps its error
    decode(chunk);
  }
  if (st.spans < n) decode(base.buf);
}

void TimelineBuilder::EncodeStaged(Stage& st, const Span& s) {
  EncodeNs(st, Ns(s.start), Ns(s.end), s.name, s.detail, s.count);
}

void TimelineBuilder::EncodeNs(Stage& st, int64_t start, int64_t end, uint64_t name, uint64_t detail,
                               uint64_t count) {
  if (st.buf.empty()) {
    st.buf_first_span = st.spans;
    st.buf_prev_ns = st.prev_end_ns - line_base_ns_;
  }
  // Every span of every level passes here: its varints go in one append.
  char bytes[5 * 10];
  char* p = bytes;
  auto put = [&p](uint64_t v) {
    for (; v >= 0x80; v >>= 7) *p++ = static_cast<char>(v | 0x80);
    *p++ = static_cast<char>(v);
  };
  const int64_t gap = start - st.prev_end_ns;  // may round to -1
  put((static_cast<uint64_t>(gap) << 1) ^ static_cast<uint64_t>(gap >> 63));
  put(static_cast<uint64_t>(end - start));
  put(name);
  put(detail);
  if (st.threshold_ns > 0) put(count);
  st.buf.append(bytes, static_cast<size_t>(p - bytes));
  st.prev_end_ns = end;
  ++st.spans;
  if (st.buf.size() >= kStreamChunkBytes) FlushStage(st);
}

void TimelineBuilder::FlushStage(Stage& st) {
  if (st.buf.empty()) return;
  uint64_t at = sink_->Append(st.buf);
  st.chunks.push_back({at, st.buf.size(), st.buf_first_span, st.buf_prev_ns});
  st.buf.clear();
}

void TimelineBuilder::EndStreamedLine() {
  streaming_line_ = false;
  if (track_.events == 0) return;
  TimelineTrack track = std::move(track_);
  track_ = {};
  for (StreamLane& lane : stream_lanes_) {
    // The merges still open, from the finest (each flush feeds the next level).
    for (size_t k = 1; k < lane.stages.size(); ++k) {
      Stage& st = lane.stages[k];
      if (!st.has_pending) continue;
      st.has_pending = false;
      const Span last = st.pending;
      Emit(st, last);
      Feed(lane, k + 1, last);
    }
    // The levels kept, as AddLevels: each at most half the last one kept.
    std::vector<size_t> kept{0};
    const uint64_t events = lane.stages[0].spans;
    if (events >= 2) {
      const int64_t extent_ns = Ns(lane.last_end) - Ns(lane.first_start);
      uint64_t last_kept = events;
      for (size_t k = 1; k < lane.stages.size() && lane.stages[k].threshold_ns / 4 <= extent_ns; ++k) {
        const uint64_t n = lane.stages[k].spans;
        if (n * 2 > last_kept || lane.stages[k].lazy) continue;  // (a lazy level is the one below: never halves it)
        kept.push_back(k);
        if (n <= 1) break;
        last_kept = n;
      }
    }
    std::vector<TimelineLevel>& levels = track.lanes.emplace_back();
    for (size_t k : kept) {
      Stage& st = lane.stages[k];
      FlushStage(st);
      TimelineLevel l{st.threshold_ns, st.spans, st.chunks.empty() ? 0 : st.chunks.front().offset, 0, {}, {}};
      for (const TimelineChunk& c : st.chunks) l.bytes += c.bytes;
      l.chunks = std::move(st.chunks);
      levels.push_back(std::move(l));
    }
  }
  stream_lanes_.clear();
  stream_lanes_.shrink_to_fit();
  tl_.events += track.events;
  tl_.tracks.push_back(std::move(track));
  base_ns_.push_back(line_base_ns_);
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
  TimelineLevel level{threshold_ns, spans.size(), blob->size(), 0, {}, {}};
  int64_t prev_end = base_ns;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    if (spans.size() > kChunkSpans && i % kChunkSpans == 0) {
      level.marks.push_back(static_cast<int64_t>(blob->size() - level.offset));
      level.marks.push_back(prev_end - base_ns);
    }
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
  if (streaming_line_) return EndStreamedLine();
  if (spans_.empty()) return;
  // Parents before children, then one lane per depth (Place).
  auto before = [](const Span& a, const Span& b) { return a.start != b.start ? a.start < b.start : a.end > b.end; };
  if (!std::is_sorted(spans_.begin(), spans_.end(), before)) std::sort(spans_.begin(), spans_.end(), before);
  if (sink_ != nullptr) {
    // Held because out of order: placed now as a streamed line.
    streaming_line_ = true;
    track_ = {};
    for (const Span& s : spans_) StreamSpan(s, s.links ? &links_[s.links - 1] : nullptr);
    spans_.clear();
    spans_.shrink_to_fit();
    links_.clear();
    links_.shrink_to_fit();
    return EndStreamedLine();
  }
  track_ = {};
  std::vector<std::vector<Span>> lanes;
  for (const Span& s : spans_) {
    int d = Place(s, s.links ? &links_[s.links - 1] : nullptr);
    if (d < 0) continue;
    if (static_cast<size_t>(d) == lanes.size()) lanes.emplace_back();
    lanes[static_cast<size_t>(d)].push_back(s);
  }
  TimelineTrack track = std::move(track_);
  track_ = {};
  const int64_t base_ns = Ns(spans_.front().start);
  // The lanes hold the spans now: freed before the levels are made (peak memory of a big line).
  spans_.clear();
  spans_.shrink_to_fit();
  links_.clear();
  links_.shrink_to_fit();
  for (std::vector<Span>& lane : lanes) {
    track.lanes.emplace_back();
    AddLevels(lane, base_ns, &track.lanes.back());
    lane.clear();
    lane.shrink_to_fit();
  }
  tl_.events += track.events;
  tl_.tracks.push_back(std::move(track));
  base_ns_.push_back(base_ns);
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
    TimelineLevel level{threshold_ns, points.size(), tl_.blob.size(), 0, {}, {}};
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
  // Which tracks are shown: the busiest kMaxTracks (the page says how
  // many others there were).
  const size_t n = tl_.tracks.size();
  std::vector<bool> keep(n, true);
  if (n > kMaxTracks) {
    std::vector<size_t> by_events(n);
    for (size_t i = 0; i < n; ++i) by_events[i] = i;
    std::stable_sort(by_events.begin(), by_events.end(),
                     [&](size_t a, size_t b) { return tl_.tracks[a].events > tl_.tracks[b].events; });
    for (size_t i = kMaxTracks; i < n; ++i) {
      keep[by_events[i]] = false;
      ++tl_.hidden_tracks;
      tl_.hidden_track_events += tl_.tracks[by_events[i]].events;
    }
  }
  // Host planes first, then devices; a plane's threads together (planes in
  // the order first seen), the busiest first: what matters is on top.
  std::unordered_map<std::string, size_t> plane_rank;
  for (const TimelineTrack& t : tl_.tracks) plane_rank.try_emplace(t.plane, plane_rank.size());
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i)
    if (keep[i]) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const TimelineTrack &x = tl_.tracks[a], &y = tl_.tracks[b];
    int px = PlaneOrder(x.plane), py = PlaneOrder(y.plane);
    if (px != py) return px < py;
    size_t rx = plane_rank[x.plane], ry = plane_rank[y.plane];
    if (rx != ry) return rx < ry;
    return x.events > y.events;
  });
  std::vector<uint32_t> new_index(n, UINT32_MAX);
  std::vector<TimelineTrack> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) {
    new_index[i] = static_cast<uint32_t>(sorted.size());
    sorted.push_back(std::move(tl_.tracks[i]));
  }
  tl_.tracks = std::move(sorted);
  for (const RawFlow& f : raw_flows_) {
    if (new_index[f.from.track] == UINT32_MAX || new_index[f.to.track] == UINT32_MAX) {
      ++tl_.hidden_flows;
      continue;
    }
    tl_.flows.push_back({new_index[f.from.track], f.from.lane, f.from.ns - tl_.start_ns, new_index[f.to.track], f.to.lane,
                         f.to.ns - tl_.start_ns});
  }
  raw_flows_.clear();
  open_flows_.clear();
  std::stable_sort(tl_.flows.begin(), tl_.flows.end(),
                   [](const TimelineFlow& a, const TimelineFlow& b) { return a.from_ns < b.from_ns; });
  return std::move(tl_);
}

void CoarsenTimeline(Timeline* tl, uint64_t max_blob_bytes, const std::function<uint64_t(const TimelineLevel&)>& cost) {
  auto weigh = [&](const TimelineLevel& l) { return cost ? cost(l) : l.bytes; };
  // Every lane's and counter's levels, finest first; the one whose finest
  // level is the largest gives it up first.
  struct Series {
    std::vector<TimelineLevel>* levels;
    size_t first = 0;  // finest level kept
    bool counter;
  };
  std::vector<Series> all;
  for (TimelineTrack& t : tl->tracks)
    for (auto& lane : t.lanes) all.push_back({&lane, 0, false});
  for (TimelineCounter& c : tl->counters) all.push_back({&c.levels, 0, true});
  std::vector<std::vector<uint64_t>> weights(all.size());
  uint64_t total = 0;
  for (size_t i = 0; i < all.size(); ++i)
    for (const TimelineLevel& l : *all[i].levels) total += weights[i].emplace_back(weigh(l));
  if (total <= max_blob_bytes) return;
  auto finest_bytes = [&](size_t i) { return weights[i][all[i].first]; };
  auto larger = [&](size_t a, size_t b) { return finest_bytes(a) < finest_bytes(b); };
  std::vector<size_t> heap;
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].levels->size() > 1) heap.push_back(i);
  std::make_heap(heap.begin(), heap.end(), larger);
  while (total > max_blob_bytes && !heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), larger);
    size_t i = heap.back();
    heap.pop_back();
    Series& s = all[i];
    const TimelineLevel& dropped = (*s.levels)[s.first];
    // Dropping this level would free more than needed and its next level is
    // far smaller: merge it at a threshold in between instead, the finest
    // one that fits, so that the page keeps what detail it can.
    const uint64_t deficit = total - max_blob_bytes, w = weights[i][s.first];
    const int64_t next_t = (*s.levels)[s.first + 1].threshold_ns;
    const uint64_t next_w = weights[i][s.first + 1];
    if (!s.counter && next_w < w / 4 && deficit + next_w < w && next_t >= 64) {
      std::vector<PlainSpan> spans = DecodeLevel(tl->blob, dropped);
      std::vector<int64_t> candidates;
      for (int64_t t = std::max<int64_t>(16, dropped.threshold_ns * 2); t * 2 <= next_t; t *= 2) candidates.push_back(t);
      // The smallest threshold that frees enough (bytes fall as it grows).
      size_t lo = 0, hi = candidates.size();
      TimelineLevel best;
      uint64_t best_w = 0;
      while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const size_t at = tl->blob.size();
        TimelineLevel l = EncodePlain(MergePlain(spans, candidates[mid]), candidates[mid], &tl->blob);
        uint64_t lw = weigh(l);
        if (lw + deficit <= w) {
          best = l, best_w = lw, hi = mid;
        } else {
          tl->blob.resize(at);
          lo = mid + 1;
        }
      }
      // Merging runs away past some threshold (chains of short spans):
      // narrow it between the last that did not fit and the first that did.
      // (None fits: between the last and the next level's threshold.)
      if (!candidates.empty() && (best_w == 0 || hi > 0)) {
        int64_t bad = best_w > 0 ? candidates[hi - 1] : candidates.back(), good = best_w > 0 ? candidates[hi] : next_t;
        for (int step = 0; step < 6 && good - bad > 1; ++step) {
          const int64_t t = bad + (good - bad) / 2;
          const size_t at = tl->blob.size();
          TimelineLevel l = EncodePlain(MergePlain(spans, t), t, &tl->blob);
          uint64_t lw = weigh(l);
          if (lw + deficit <= w) {
            best = l, best_w = lw, good = t;
          } else {
            tl->blob.resize(at);
            bad = t;
          }
        }
      }
      if (best_w > 0) {
        if (dropped.threshold_ns == 0) ++tl->coarsened_lanes, tl->coarsened_events += dropped.spans;
        tl->coarsened_ns = std::max(tl->coarsened_ns, best.threshold_ns);
        (*s.levels)[s.first] = best;
        weights[i][s.first] = best_w;
        total = total - w + best_w;
        continue;
      }
    }
    total -= weights[i][s.first];
    if (s.first == 0) {
      if (s.counter) ++tl->coarsened_counters;
      else ++tl->coarsened_lanes, tl->coarsened_events += dropped.spans;
    }
    ++s.first;
    tl->coarsened_ns = std::max(tl->coarsened_ns, (*s.levels)[s.first].threshold_ns);
    if (s.first + 1 < s.levels->size()) {
      heap.push_back(i);
      std::push_heap(heap.begin(), heap.end(), larger);
    }
  }
  // The blob again, with the levels kept.
  std::string blob;
  for (Series& s : all) {
    std::vector<TimelineLevel> kept(s.levels->begin() + static_cast<std::ptrdiff_t>(s.first), s.levels->end());
    for (TimelineLevel& l : kept) {
      size_t at = blob.size();
      blob.append(tl->blob, l.offset, l.bytes);
      l.offset = at;
    }
    *s.levels = std::move(kept);
  }
  tl->blob = std::move(blob);
}

}  // namespace spyglass::report
