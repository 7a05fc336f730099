// The pprof writer of memory snapshots (EncodePprofGz, pprof.h). Part of
// libspyglass_memory, which the heap hook loads into every profiled program:
// the protobuf wire format is written by hand here (varints and
// length-delimited fields, a few dozen lines) so that the hook does not load
// libprotobuf; the reader in pprof.cc, used by the CLI only, uses protobuf's.
// Next to generated profile.proto code it is also 1.2x faster with a third of
// the peak memory (BENCHMARKS.md "pprof").
#include <string>
#include <unordered_map>
#include <vector>

#include "common/gzip.h"
#include "memory/pprof.h"

namespace spyglass::memory {
namespace {

constexpr uint32_t kVarint = 0, kLen = 2;

// Profile field numbers (profile.proto).
enum : uint32_t {
  kProfileSampleType = 1, kProfileSample = 2, kProfileLocation = 4, kProfileFunction = 5, kProfileStringTable = 6,
  kProfileTimeNanos = 9, kProfileDurationNanos = 10, kProfilePeriodType = 11, kProfilePeriod = 12,
  kProfileComment = 13,
};

class StringTable {
 public:
  StringTable() { index(""); }
  uint64_t index(const std::string& s) {
    auto [it, inserted] = ids_.emplace(s, strings_.size());
    if (inserted) strings_.push_back(&it->first);
    return it->second;
  }
  const std::vector<const std::string*>& strings() const { return strings_; }

 private:
  std::unordered_map<std::string, uint64_t> ids_;
  std::vector<const std::string*> strings_;
};

// A message being written: fields are appended to `buf`.
class Msg {
 public:
  void raw_varint(uint64_t v) {
    while (v >= 0x80) {
      buf_.push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    buf_.push_back(static_cast<char>(v));
  }
  void tag(uint32_t field, uint32_t wire) { raw_varint((uint64_t{field} << 3) | wire); }
  // proto3: a zero scalar is not written.
  void varint(uint32_t field, uint64_t v) {
    if (v == 0) return;
    tag(field, kVarint);
    raw_varint(v);
  }
  void bytes(uint32_t field, const std::string& b) {
    tag(field, kLen);
    raw_varint(b.size());
    buf_.append(b);
  }
  void packed(uint32_t field, const std::vector<uint64_t>& vs) {
    if (vs.empty()) return;
    Msg run;
    for (uint64_t v : vs) run.raw_varint(v);
    bytes(field, run.buf_);
  }
  void sub(uint32_t field, const Msg& m) { bytes(field, m.buf_); }
  const std::string& data() const { return buf_; }

 private:
  std::string buf_;
};

}  // namespace

std::string EncodePprofGz(const ProfileData& data, int gzip_level) {
  StringTable st;
  Msg o;
  std::vector<std::pair<std::string, std::string>> types = data.sample_types;
  if (types.empty()) types = {{"allocations", "count"}, {"space", "bytes"}};
  for (const auto& [type, unit] : types) {
    Msg vt;
    vt.varint(1, st.index(type));
    vt.varint(2, st.index(unit));
    o.sub(kProfileSampleType, vt);
  }
  uint64_t kind_key = st.index("kind"), device_key = st.index("device");
  for (const ProfileSample& s : data.samples) {
    Msg m;
    m.packed(1, s.location_ids);
    // values are int64 (two's complement varints)
    m.packed(2, {static_cast<uint64_t>(s.count), static_cast<uint64_t>(s.bytes)});
    for (auto [key, value] : {std::pair{kind_key, &s.kind}, std::pair{device_key, &s.device}}) {
      if (value->empty()) continue;
      Msg l;
      l.varint(1, key);
      l.varint(2, st.index(*value));
      m.sub(3, l);
    }
    for (const auto& [key, value] : s.labels) {
      Msg l;
      l.varint(1, st.index(key));
      l.varint(2, st.index(value));
      m.sub(3, l);
    }
    o.sub(kProfileSample, m);
  }
  for (size_t i = 0; i < data.locations.size(); ++i) {
    const ProfileLocation& loc = data.locations[i];
    Msg m;
    m.varint(1, i + 1);
    m.varint(3, loc.address);
    for (const ProfileLine& l : loc.lines) {
      Msg lm;
      lm.varint(1, l.function_id);
      lm.varint(2, static_cast<uint64_t>(l.line));
      m.sub(4, lm);
    }
    o.sub(kProfileLocation, m);
  }
  for (size_t i = 0; i < data.functions.size(); ++i) {
    const ProfileFunction& f = data.functions[i];
    Msg m;
    m.varint(1, i + 1);
    m.varint(2, st.index(f.name));
    m.varint(3, st.index(f.system_name));
    m.varint(4, st.index(f.filename));
    m.varint(5, static_cast<uint64_t>(f.start_line));
    o.sub(kProfileFunction, m);
  }
  o.varint(kProfileTimeNanos, static_cast<uint64_t>(data.time_nanos));
  o.varint(kProfileDurationNanos, static_cast<uint64_t>(data.duration_nanos));
  if (!data.period_type.first.empty()) {
    Msg vt;
    vt.varint(1, st.index(data.period_type.first));
    vt.varint(2, st.index(data.period_type.second));
    o.sub(kProfilePeriodType, vt);
    o.varint(kProfilePeriod, static_cast<uint64_t>(data.period));
  }
  std::vector<uint64_t> comments;
  for (const std::string& c : data.comments) comments.push_back(st.index(c));
  for (uint64_t c : comments) {
    o.tag(kProfileComment, kVarint);
    o.raw_varint(c);  // repeated: each written, 0 included
  }
  for (const std::string* s : st.strings()) o.bytes(kProfileStringTable, *s);
  return GzipCompress(o.data(), gzip_level);
}

}  // namespace spyglass::memory
