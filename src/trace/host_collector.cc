#include "trace/host_collector.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

namespace spyglass::internal {
namespace {

std::string_view Strip(std::string_view s) {
  while (!s.empty() && isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits on ',' except inside quotes and brackets.
std::vector<std::string_view> SplitArgs(std::string_view s) {
  std::vector<std::string_view> out;
  std::vector<char> closers;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (!closers.empty() && c == closers.back()) {
      closers.pop_back();
    } else if (!closers.empty() && (closers.back() == '"' || closers.back() == '\'')) {
      // inside a quoted string: brackets do not count
    } else if (c == '"' || c == '\'') {
      closers.push_back(c);
    } else if (c == '(') {
      closers.push_back(')');
    } else if (c == '[') {
      closers.push_back(']');
    } else if (c == '{') {
      closers.push_back('}');
    } else if (c == ',' && closers.empty()) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(s.substr(start));
  return out;
}

// Begin and argument records of a thread: the line's events and stats are
// reserved exactly, not grown by doubling (which would copy them and hold up
// to twice their size for a while).
struct RecordCounts {
  size_t begins = 0;
  size_t args = 0;
};
RecordCounts CountRecords(const RawThread& t) {
  RecordCounts n;
  for (auto [p, end] : t.spans) {
    while (p < end) {
      size_t words = record_words(*p);
      if (words == 0 || p + words > end) break;
      uint64_t tag = *p >> 56;
      if (!(*p & kEndBit)) {
        n.begins += tag == kTagStatic || tag == kTagCopied;
        n.args += tag == kTagArg;
      }
      p += words;
    }
  }
  return n;
}

constexpr size_t kSkipped = ~size_t{0};

struct OpenEvent {
  size_t index;  // into line.events; kSkipped: begun before the start, left out
  uint64_t begin_ticks;
};

}  // namespace

ParsedName ParseTraceMeName(std::string_view encoded) {
  ParsedName out{encoded, {}};
  if (encoded.empty() || encoded.back() != '#') return out;
  std::string_view body = encoded.substr(0, encoded.size() - 1);
  size_t hash = body.find('#');
  if (hash == std::string_view::npos) return out;
  out.name = Strip(body.substr(0, hash));
  std::string_view meta = body.substr(hash + 1);
  size_t next = meta.find('#');
  if (next != std::string_view::npos) meta = meta.substr(0, next);
  for (std::string_view frag : SplitArgs(meta)) {
    if (frag.size() <= 1) continue;
    size_t eq = frag.find('=');
    if (eq == std::string_view::npos) continue;
    std::string_view k = Strip(frag.substr(0, eq)), v = Strip(frag.substr(eq + 1));
    if (!k.empty() && !v.empty()) out.args.emplace_back(k, v);
  }
  return out;
}

model::Stat StatFromText(model::Plane& plane, std::string_view key, std::string_view value) {
  const char* b = value.data();
  const char* e = b + value.size();
  int64_t i;
  if (auto r = std::from_chars(b, e, i); r.ec == std::errc() && r.ptr == e) return plane.int_stat(key, i);
  uint64_t u;
  if (auto r = std::from_chars(b, e, u); r.ec == std::errc() && r.ptr == e) return plane.uint_stat(key, u);
  std::string tmp(value);
  char* end = nullptr;
  double d = std::strtod(tmp.c_str(), &end);
  if (end == tmp.c_str() + tmp.size() && !tmp.empty()) return plane.double_stat(key, d);
  return plane.ref_stat(key, value);
}

HostCollectStats CollectHostEvents(const std::vector<RawThread>& threads, uint64_t start_ticks,
                                   uint64_t stop_ticks, const TickConverter& clock, model::Plane* plane,
                                   uint64_t since_ticks) {
  HostCollectStats stats;
  // Static names are interned once per distinct pointer.
  struct NameInfo {
    uint32_t id;
    std::vector<model::Stat> args;  // from a TraceMe-encoded name
  };
  std::unordered_map<uint64_t, NameInfo> static_names;
  auto intern_name = [&](std::string_view encoded) {
    ParsedName parsed = ParseTraceMeName(encoded);
    NameInfo info{plane->intern_event(parsed.name), {}};
    for (auto& [k, v] : parsed.args) info.args.push_back(StatFromText(*plane, k, v));
    return info;
  };
  auto to_ps = [&](uint64_t ticks) {
    return ticks <= start_ticks ? int64_t{0} : clock.ns_between(start_ticks, ticks) * 1000;
  };

  for (const RawThread& t : threads) {
    stats.dropped += t.dropped;
    stats.overwritten += t.overwritten;
    stats.held_since_ticks = std::max(stats.held_since_ticks, t.held_since_ticks);
    if (t.spans.empty()) continue;
    ++stats.threads;
    model::Line& line = plane->line_with_id(t.tid);
    if (line.name.empty()) {
      line.name = model::ValidUtf8(t.name);
      line.display_name = line.name;
    }
    RecordCounts counts = CountRecords(t);
    line.events.reserve(line.events.size() + counts.begins);
    line.reserve_stats(counts.args, counts.args);
    std::vector<OpenEvent> open;
    auto begin_event = [&](const NameInfo& info, uint64_t ticks) {
      model::Event e;
      e.metadata_id = info.id;
      e.offset_ps = to_ps(ticks);
      open.push_back({line.events.size(), ticks});
      line.events.push_back(e);
      line.add_stats(line.events.back(), info.args);
    };
    for (size_t span = 0; span < t.spans.size(); ++span) {
      auto [p, end] = t.spans[span];
      while (p < end) {
        uint64_t w = *p;
        if (w & kEndBit) {
          ++p;
          if (open.empty()) continue;  // its begin was dropped
          if (open.back().index == kSkipped) {
            open.pop_back();
            continue;
          }
          model::Event& e = line.events[open.back().index];
          e.duration_ps = to_ps(w & ~kEndBit) - e.offset_ps;
          if (e.duration_ps < 0) e.duration_ps = 0;
          open.pop_back();
          continue;
        }
        uint64_t tag = w >> 56;
        uint64_t payload = w & kPayloadMask;
        if (tag == kTagStatic) {
          if (p + 2 > end) break;
          if (p[1] < since_ticks) {
            open.push_back({kSkipped, p[1]});
            p += 2;
            continue;
          }
          auto it = static_names.find(payload);
          if (it == static_names.end())
            it = static_names.emplace(payload, intern_name(reinterpret_cast<const char*>(payload))).first;
          begin_event(it->second, p[1]);
          p += 2;
        } else if (tag == kTagCopied) {
          size_t words = words_for(payload);
          if (p + 2 + words > end) break;
          std::string_view name(reinterpret_cast<const char*>(p + 1), payload);
          if (p[1 + words] < since_ticks) open.push_back({kSkipped, p[1 + words]});
          else begin_event(intern_name(name), p[1 + words]);
          p += 2 + words;
        } else if (tag == kTagArg) {
          auto type = static_cast<ArgType>((w >> 48) & 0xff);
          size_t klen = (w >> 32) & 0xffff;
          size_t vlen = w & 0xffffffff;
          size_t total = 1 + words_for(klen) + words_for(vlen);
          if (p + total > end) break;
          std::string_view key(reinterpret_cast<const char*>(p + 1), klen);
          const uint64_t* v = p + 1 + words_for(klen);
          if (!open.empty() && open.back().index != kSkipped) {
            model::Event& e = line.events[open.back().index];
            model::Stat s;
            switch (type) {
              case ArgType::kInt64: s = plane->int_stat(key, static_cast<int64_t>(*v)); break;
              case ArgType::kUint64: s = plane->uint_stat(key, *v); break;
              case ArgType::kDouble: {
                double d;
                std::memcpy(&d, v, 8);
                s = plane->double_stat(key, d);
                break;
              }
              case ArgType::kString:
                s = plane->ref_stat(key, std::string_view(reinterpret_cast<const char*>(v), vlen));
                break;
            }
            line.add_stat(e, s);
          }
          p += total;
        } else {
          break;  // unknown record: the rest of this span cannot be trusted
        }
      }
      // Parsed: its memory goes back now, while the model grows.
      if (span < t.owned_spans) recorder_free_chunk(t.spans[span].first);
    }
    // Still open at stop: close at the stop time and say so.
    for (const OpenEvent& o : open) {
      if (o.index == kSkipped) continue;
      model::Event& e = line.events[o.index];
      e.duration_ps = std::max<int64_t>(0, to_ps(stop_ticks) - e.offset_ps);
      line.add_stat(e, plane->int_stat(model::kIncompleteStat, 1));
      ++stats.incomplete;
    }
  }
  for (model::Line& l : plane->lines) {
    // A thread id reused by a later thread joins the same line: keep order.
    bool sorted = std::is_sorted(l.events.begin(), l.events.end(), [](const model::Event& a, const model::Event& b) {
      return a.offset_ps < b.offset_ps || (a.offset_ps == b.offset_ps && a.duration_ps > b.duration_ps);
    });
    if (!sorted) l.sort_events();
    stats.events += l.events.size();
  }
  return stats;
}

}  // namespace spyglass::internal
