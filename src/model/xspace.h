// The profile model in the middle: collectors write it, converters read it.
//
// It mirrors the XSpace schema (proto/xplane.proto), the interchange format
// with XProf, but keeps events compact so that a profile of 100M events fits
// in about the memory its recording took: 24 bytes an event, plus 8 for its
// stat list and 16 a stat (string values are kept once per plane).
// Metadata ids are dense indexes starting at 1 (0 unused), as the reference
// builder assigns them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/schema.h"

namespace spyglass::model {

enum class StatKind : uint8_t { kInt64, kUint64, kDouble, kString, kBytes, kRef };

struct Stat {
  uint32_t metadata_id = 0;
  StatKind kind = StatKind::kInt64;
  union {
    int64_t i64 = 0;
    uint64_t u64;
    double f64;
    uint64_t ref;        // id of the XStatMetadata whose name is the string value
    uint64_t str_index;  // kString / kBytes: the value is Plane::stat_str
  };
};
static_assert(sizeof(Stat) == 16);

inline constexpr uint32_t kNoStats = UINT32_MAX;

struct Event {
  int64_t offset_ps = 0;    // from Line::timestamp_ns
  int64_t duration_ps = 0;
  uint32_t metadata_id = 0;
  uint32_t stats = kNoStats;  // index into Line::stat_lists
};

struct Line {
  int64_t id = 0;
  int64_t display_id = 0;
  std::string name;
  std::string display_name;
  int64_t timestamp_ns = 0;
  int64_t duration_ps = 0;
  std::vector<Event> events;

  // The stats of an event of this line (empty if none).
  std::span<const Stat> stats_of(const Event& e) const {
    if (e.stats == kNoStats) return {};
    const StatRange& r = stat_ranges_[e.stats];
    return {stat_pool_.data() + r.first, r.count};
  }
  // Appends to the stats of `e`, an event of this line (or about to be).
  void add_stat(Event& e, const Stat& s);
  void add_stats(Event& e, std::span<const Stat> stats) {
    if (e.stats == kNoStats && !stats.empty()) {  // a fresh event: one range, one append
      e.stats = static_cast<uint32_t>(stat_ranges_.size());
      stat_ranges_.push_back({static_cast<uint32_t>(stat_pool_.size()), static_cast<uint32_t>(stats.size())});
      stat_pool_.insert(stat_pool_.end(), stats.begin(), stats.end());
      return;
    }
    for (const Stat& s : stats) add_stat(e, s);
  }
  // How many stats the line's events hold in all (a size estimate).
  size_t stat_count() const { return stat_pool_.size(); }
  // Every stat of the line's events, to rewrite ids in place.
  std::span<Stat> mutable_stats() { return stat_pool_; }
  // Appends the events of `other` with their stats.
  void append(Line&& other);
  // Room for `events` events with stats and `stats` stats in all.
  void reserve_stats(size_t events, size_t stats) {
    stat_ranges_.reserve(stat_ranges_.size() + events);
    stat_pool_.reserve(stat_pool_.size() + stats);
  }
  // Room for `events` events with `stats` stats in all, known up front (a
  // converter that counted first): large storage goes on transparent huge
  // pages, which costs one page fault per 2 MiB written instead of 512.
  void reserve_exact(size_t events, size_t stats);
  // Sorts by (start ascending, duration descending): parents before children.
  void sort_events();

 private:
  // One flat pool per line instead of a vector per event: an event's stats
  // are a range of it, appended in place while the event is the last to get
  // stats (always, for the recorder's events), else moved to the end.
  struct StatRange {
    uint32_t first;
    uint32_t count;
  };
  std::vector<Stat> stat_pool_;
  std::vector<StatRange> stat_ranges_;
};

struct EventMetadata {
  int64_t id = 0;
  std::string name;
  std::string display_name;
  std::vector<Stat> stats;
};

struct StatMetadata {
  int64_t id = 0;
  std::string name;
  std::string description;
};

class Plane {
 public:
  int64_t id = 0;
  std::string name;
  std::vector<Line> lines;
  std::vector<Stat> stats;

  // Dense by id; index 0 is unused.
  const std::vector<EventMetadata>& event_metadata() const { return event_metadata_; }
  const std::vector<StatMetadata>& stat_metadata() const { return stat_metadata_; }
  EventMetadata& event_metadata_at(uint32_t id) { return event_metadata_[id]; }

  // Interning: the same name always maps to the same id in a plane.
  uint32_t intern_event(std::string_view name);
  uint32_t intern_stat(std::string_view name);

  // Builders of stats whose key is interned here.
  Stat int_stat(std::string_view key, int64_t v);
  Stat uint_stat(std::string_view key, uint64_t v);
  Stat double_stat(std::string_view key, double v);
  Stat str_stat(std::string_view key, std::string v);
  Stat ref_stat(std::string_view key, std::string_view value);  // interned string value
  Stat bytes_stat(std::string_view key, std::string v);

  // The stat value as text (ref values resolved).
  std::string stat_text(const Stat& s) const;
  // Moves the string values of `other`'s stats here; returns what to add to
  // their str_index.
  uint64_t adopt_strings(Plane& other);
  // Keeps the value of a kString or kBytes stat; returns its str_index.
  uint64_t add_string(std::string v) {
    strings_.push_back(std::move(v));
    return strings_.size() - 1;
  }
  // The value of a kString or kBytes stat, empty for the other kinds.
  std::string_view stat_str(const Stat& s) const {
    return (s.kind == StatKind::kString || s.kind == StatKind::kBytes) && s.str_index < strings_.size()
               ? std::string_view(strings_[s.str_index])
               : std::string_view();
  }
  const std::string& stat_name(const Stat& s) const { return stat_metadata_[s.metadata_id].name; }
  const StatMetadata* find_stat_metadata(std::string_view name) const;
  Line& line_with_id(int64_t id);  // finds or appends

 private:
  std::vector<EventMetadata> event_metadata_{EventMetadata{}};
  std::vector<StatMetadata> stat_metadata_{StatMetadata{}};
  std::unordered_map<std::string, uint32_t> event_ids_;
  std::unordered_map<std::string, uint32_t> stat_ids_;
  std::vector<std::string> strings_;  // values of kString / kBytes stats
};

// `s` with invalid UTF-8 sequences replaced by U+FFFD: protobuf rejects
// string fields that are not UTF-8, so every name entering the model is valid.
std::string ValidUtf8(std::string_view s);
// Asks for transparent huge pages on the 2 MiB-aligned part of [p, p+bytes)
// not written yet (nothing below 4 MiB; a hint only).
void AdviseHugePages(const void* p, size_t bytes);

struct Space {
  std::vector<Plane> planes;
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
  std::vector<std::string> hostnames;

  Plane* find_plane(std::string_view name);
  const Plane* find_plane(std::string_view name) const;
  Plane& plane(std::string_view name);  // finds or appends
  uint64_t event_count() const;
};

}  // namespace spyglass::model
