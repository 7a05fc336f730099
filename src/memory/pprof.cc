#include "memory/pprof.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <unordered_map>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

namespace spyglass::memory {
namespace {

using google::protobuf::io::CodedInputStream;

constexpr uint32_t kVarint = 0, kLen = 2;
constexpr uint32_t Tag(uint32_t field, uint32_t wire) { return (field << 3) | wire; }

// Profile field numbers (profile.proto).
enum : uint32_t {
  kProfileSampleType = 1, kProfileSample = 2, kProfileMapping = 3, kProfileLocation = 4, kProfileFunction = 5,
  kProfileStringTable = 6, kProfileTimeNanos = 9, kProfileComment = 13,
};

}  // namespace

// ---- reading ------------------------------------------------------------------
namespace {

Status Bad(const std::string& what) {
  return InvalidArgumentError("not a valid pprof profile: " + what);
}

Status Gunzip(std::string_view in, std::string* out) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) return InternalError("zlib init failed");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  char buf[1 << 16];
  int rc;
  do {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      inflateEnd(&z);
      if (rc == Z_BUF_ERROR) return Bad("the gzip data is truncated");
      return Bad(std::string("the gzip data is corrupt (") + (z.msg ? z.msg : "inflate error") + ")");
    }
    out->append(buf, sizeof buf - z.avail_out);
  } while (rc != Z_STREAM_END);
  inflateEnd(&z);
  return Status::Ok();
}

struct RawLine {
  uint64_t function_id = 0;
  int64_t line = 0;
};
struct RawLabel {
  int64_t key = 0, str = 0, num = 0;
};
struct RawSample {
  std::vector<uint64_t> locs;
  std::vector<int64_t> values;
  std::vector<RawLabel> labels;
};
struct RawFunction {
  int64_t name = 0, filename = 0;
};

// Reads a varint field value or a packed run into `out`.
bool ReadRepeatedVarint(CodedInputStream& in, uint32_t wire, std::vector<uint64_t>* out) {
  if (wire == kVarint) {
    uint64_t v;
    if (!in.ReadVarint64(&v)) return false;
    out->push_back(v);
    return true;
  }
  if (wire != kLen) return false;
  uint32_t len;
  if (!in.ReadVarint32(&len)) return false;
  auto limit = in.PushLimit(static_cast<int>(len));
  while (in.BytesUntilLimit() > 0) {
    uint64_t v;
    if (!in.ReadVarint64(&v)) return false;
    out->push_back(v);
  }
  in.PopLimit(limit);
  return true;
}

bool SkipField(CodedInputStream& in, uint32_t tag) {
  switch (tag & 7) {
    case 0: {
      uint64_t v;
      return in.ReadVarint64(&v);
    }
    case 1: return in.Skip(8);
    case 2: {
      uint32_t len;
      return in.ReadVarint32(&len) && in.Skip(static_cast<int>(len));
    }
    case 5: return in.Skip(4);
    default: return false;
  }
}

// Calls f(field, wire, in) for each field of a length-delimited message.
template <typename F>
bool ForEachField(CodedInputStream& in, F f) {
  uint32_t len;
  if (!in.ReadVarint32(&len)) return false;
  if (static_cast<int>(len) < 0) return false;
  auto limit = in.PushLimit(static_cast<int>(len));
  while (in.BytesUntilLimit() > 0) {
    uint32_t tag = in.ReadTag();
    if (tag == 0) return false;
    if (!f(tag >> 3, tag & 7)) return false;
  }
  in.PopLimit(limit);
  return true;
}

}  // namespace

Status ParsePprof(std::string_view bytes, PprofProfile* out) {
  *out = PprofProfile{};
  if (bytes.empty()) return Bad("the file is empty");
  std::string plain;
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f && static_cast<unsigned char>(bytes[1]) == 0x8b) {
    if (Status s = Gunzip(bytes, &plain); !s.ok()) return s;
    bytes = plain;
  }
  CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(bytes.size()));
  std::vector<std::pair<int64_t, int64_t>> sample_types;
  std::vector<RawSample> samples;
  std::unordered_map<uint64_t, std::vector<RawLine>> locations;
  std::unordered_map<uint64_t, RawFunction> functions;
  std::vector<std::string> strings;
  bool ok = true;
  while (ok) {
    uint32_t tag = in.ReadTag();
    if (tag == 0) {
      ok = in.CurrentPosition() == static_cast<int>(bytes.size());
      break;
    }
    uint32_t field = tag >> 3, wire = tag & 7;
    auto varint_of = [&](uint32_t w, uint64_t* v) { return w == kVarint && in.ReadVarint64(v); };
    if (field == kProfileSampleType && wire == kLen) {
      uint64_t type = 0, unit = 0;
      ok = ForEachField(in, [&](uint32_t f, uint32_t w) {
        if (f == 1) return varint_of(w, &type);
        if (f == 2) return varint_of(w, &unit);
        return SkipField(in, (f << 3) | w);
      });
      sample_types.emplace_back(type, unit);
    } else if (field == kProfileSample && wire == kLen) {
      RawSample s;
      ok = ForEachField(in, [&](uint32_t f, uint32_t w) {
        if (f == 1) return ReadRepeatedVarint(in, w, &s.locs);
        if (f == 2) {
          std::vector<uint64_t> v;
          if (!ReadRepeatedVarint(in, w, &v)) return false;
          for (uint64_t x : v) s.values.push_back(static_cast<int64_t>(x));
          return true;
        }
        if (f == 3 && w == kLen) {
          RawLabel l;
          uint64_t v;
          bool r = ForEachField(in, [&](uint32_t lf, uint32_t lw) {
            if (lf >= 1 && lf <= 3) {
              if (!varint_of(lw, &v)) return false;
              (lf == 1 ? l.key : lf == 2 ? l.str : l.num) = static_cast<int64_t>(v);
              return true;
            }
            return SkipField(in, (lf << 3) | lw);
          });
          s.labels.push_back(l);
          return r;
        }
        return SkipField(in, (f << 3) | w);
      });
      samples.push_back(std::move(s));
    } else if (field == kProfileLocation && wire == kLen) {
      uint64_t id = 0;
      std::vector<RawLine> lines;
      ok = ForEachField(in, [&](uint32_t f, uint32_t w) {
        if (f == 1) return varint_of(w, &id);
        if (f == 4 && w == kLen) {
          RawLine l;
          uint64_t v;
          bool r = ForEachField(in, [&](uint32_t lf, uint32_t lw) {
            if (lf == 1) return varint_of(lw, &l.function_id);
            if (lf == 2) {
              if (!varint_of(lw, &v)) return false;
              l.line = static_cast<int64_t>(v);
              return true;
            }
            return SkipField(in, (lf << 3) | lw);
          });
          lines.push_back(l);
          return r;
        }
        return SkipField(in, (f << 3) | w);
      });
      if (ok && id == 0) return Bad("a location has the reserved id 0");
      if (ok && !locations.emplace(id, std::move(lines)).second) return Bad("two locations share id " + std::to_string(id));
    } else if (field == kProfileFunction && wire == kLen) {
      uint64_t id = 0, v = 0;
      RawFunction fn;
      ok = ForEachField(in, [&](uint32_t f, uint32_t w) {
        if (f == 1) return varint_of(w, &id);
        if (f == 2 || f == 4) {
          if (!varint_of(w, &v)) return false;
          (f == 2 ? fn.name : fn.filename) = static_cast<int64_t>(v);
          return true;
        }
        return SkipField(in, (f << 3) | w);
      });
      if (ok && id == 0) return Bad("a function has the reserved id 0");
      if (ok && !functions.emplace(id, fn).second) return Bad("two functions share id " + std::to_string(id));
    } else if (field == kProfileStringTable && wire == kLen) {
      uint32_t len;
      std::string s;
      ok = in.ReadVarint32(&len) && in.ReadString(&s, static_cast<int>(len));
      strings.push_back(std::move(s));
    } else if (field == kProfileTimeNanos && wire == kVarint) {
      uint64_t v;
      ok = in.ReadVarint64(&v);
      out->time_nanos = static_cast<int64_t>(v);
    } else {
      ok = SkipField(in, tag);
    }
  }
  if (!ok) return Bad("the protobuf data is truncated or corrupt");
  if (strings.empty() || !strings[0].empty()) return Bad("string_table[0] must be \"\" (is this a pprof file?)");
  if (sample_types.empty()) return Bad("no sample types");
  auto str = [&](int64_t i, std::string* s) {
    if (i < 0 || static_cast<size_t>(i) >= strings.size()) return false;
    *s = strings[static_cast<size_t>(i)];
    return true;
  };
  for (size_t i = 0; i < sample_types.size(); ++i) {
    std::string t, u;
    if (!str(sample_types[i].first, &t) || !str(sample_types[i].second, &u)) return Bad("a string index is out of range");
    std::string base = t.rfind("inuse_", 0) == 0 ? t.substr(6) : t;
    if (base == "allocations" || base == "objects") out->count_index = static_cast<int>(i);
    if (base == "space") out->bytes_index = static_cast<int>(i);
    out->sample_types.emplace_back(t, u);
  }
  if (out->bytes_index < 0) out->bytes_index = static_cast<int>(sample_types.size()) - 1;
  for (RawSample& rs : samples) {
    if (rs.values.size() != sample_types.size())
      return Bad("a sample has " + std::to_string(rs.values.size()) + " values vs. " +
                 std::to_string(sample_types.size()) + " sample types");
    PprofSample s;
    s.values = std::move(rs.values);
    for (uint64_t id : rs.locs) {
      auto it = locations.find(id);
      if (it == locations.end()) return Bad("a sample refers to missing location " + std::to_string(id));
      for (const RawLine& l : it->second) {
        auto f = functions.find(l.function_id);
        if (f == functions.end()) return Bad("a location refers to missing function " + std::to_string(l.function_id));
        PprofFrame fr;
        if (!str(f->second.name, &fr.function) || !str(f->second.filename, &fr.file))
          return Bad("a string index is out of range");
        fr.line = l.line;
        s.frames.push_back(std::move(fr));
      }
    }
    for (const RawLabel& l : rs.labels) {
      std::string k, v;
      if (!str(l.key, &k) || !str(l.str, &v)) return Bad("a string index is out of range");
      s.labels[k] = l.str ? v : std::to_string(l.num);
    }
    out->samples.push_back(std::move(s));
  }
  return Status::Ok();
}

Status ReadPprofFile(const std::string& path, PprofProfile* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFoundError("cannot open " + path);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Status s = ParsePprof(bytes, out);
  if (!s.ok()) return Status(s.code(), path + ": " + s.message());
  return s;
}

// ---- reports ----------------------------------------------------------------------
namespace {

bool IsPlumbing(const std::string& fn) {
  static const char* const kPrefixes[] = {
      "operator new", "operator delete", "malloc", "calloc", "realloc", "reallocarray", "posix_memalign",
      "aligned_alloc", "memalign", "valloc", "pvalloc", "__libc_", "std::", "__gnu_cxx::", "__cxx",
      "spyglass::memory::", "void std::", "__new_allocator", "allocator<"};
  for (const char* p : kPrefixes)
    if (fn.rfind(p, 0) == 0) return true;
  // "T* std::..." / "std::vector<...>* ..." return-type prefixed template instances
  size_t sp = fn.find(' ');
  size_t paren = fn.find('(');
  if (sp != std::string::npos && sp < paren && fn.compare(sp + 1, 5, "std::") == 0) return true;
  return false;
}

std::string Basename(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

std::string FrameText(const PprofFrame& f) {
  std::string out = f.function;
  if (out.size() > 120) out = out.substr(0, 117) + "...";
  if (!f.file.empty()) {
    out += "  " + Basename(f.file);
    if (f.line > 0) out += ":" + std::to_string(f.line);
  }
  return out;
}

std::string WithCommas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return (v < 0 ? "-" : "") + s;
}

struct Totals {
  int64_t bytes = 0, count = 0;
};

int64_t Value(const PprofProfile&, const PprofSample& s, int idx) {
  return idx >= 0 && static_cast<size_t>(idx) < s.values.size() ? s.values[static_cast<size_t>(idx)] : 0;
}

std::map<std::string, Totals> BySite(const PprofProfile& p, Totals* total) {
  std::map<std::string, Totals> out;
  for (const PprofSample& s : p.samples) {
    Totals& t = out[CallSite(s)];
    t.bytes += Value(p, s, p.bytes_index);
    t.count += Value(p, s, p.count_index);
    total->bytes += Value(p, s, p.bytes_index);
    total->count += Value(p, s, p.count_index);
  }
  return out;
}

std::string Line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Line(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

}  // namespace

std::string HumanBytes(int64_t bytes) {
  double v = static_cast<double>(bytes < 0 ? -bytes : bytes);
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%s%lld B", bytes < 0 ? "-" : "", static_cast<long long>(bytes < 0 ? -bytes : bytes));
  else
    std::snprintf(buf, sizeof buf, "%s%.1f %s", bytes < 0 ? "-" : "", v, units[u]);
  return buf;
}

std::string CallSite(const PprofSample& s) {
  if (s.frames.empty()) return "<no stack>";
  for (const PprofFrame& f : s.frames)
    if (!IsPlumbing(f.function)) return FrameText(f);
  return FrameText(s.frames.front());
}

std::string MemTopReport(const PprofProfile& p, const std::string& name, size_t top) {
  Totals total;
  std::map<std::string, Totals> sites = BySite(p, &total);
  std::map<std::string, Totals> devices;
  for (const PprofSample& s : p.samples) {
    auto get = [&](const char* k) {
      auto it = s.labels.find(k);
      return it == s.labels.end() ? std::string("-") : it->second;
    };
    Totals& t = devices[get("device") + "  " + get("kind")];
    t.bytes += Value(p, s, p.bytes_index);
    t.count += Value(p, s, p.count_index);
  }
  std::string out = "Live memory in " + name + ": " + HumanBytes(total.bytes) + " in " + WithCommas(total.count) +
                    " allocations\n\nBy device and kind:\n";
  for (const auto& [k, t] : devices)
    out += Line("  %-28s %12s %12s allocations\n", k.c_str(), HumanBytes(t.bytes).c_str(), WithCommas(t.count).c_str());
  std::vector<std::pair<std::string, Totals>> v(sites.begin(), sites.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
  out += Line("\nTop %zu call sites by live bytes:\n", std::min(top, v.size()));
  out += Line("  %12s %7s %12s  %s\n", "bytes", "%", "allocations", "call site");
  for (size_t i = 0; i < v.size() && i < top; ++i) {
    double pct = total.bytes ? 100.0 * static_cast<double>(v[i].second.bytes) / static_cast<double>(total.bytes) : 0;
    out += Line("  %12s %6.1f%% %12s  ", HumanBytes(v[i].second.bytes).c_str(), pct, WithCommas(v[i].second.count).c_str());
    out += v[i].first + "\n";
  }
  return out;
}

std::string MemDiffReport(const PprofProfile& base, const PprofProfile& cur, const std::string& base_name,
                          const std::string& cur_name, size_t top) {
  Totals tb, tc;
  std::map<std::string, Totals> b = BySite(base, &tb), c = BySite(cur, &tc);
  struct Row {
    std::string site;
    Totals before, after;
    int64_t dbytes() const { return after.bytes - before.bytes; }
  };
  std::vector<Row> rows;
  for (const auto& [k, t] : c) rows.push_back({k, b.count(k) ? b[k] : Totals{}, t});
  for (const auto& [k, t] : b)
    if (!c.count(k)) rows.push_back({k, t, Totals{}});
  std::sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return x.dbytes() > y.dbytes(); });
  auto sign = [](int64_t v) { return (v > 0 ? "+" : "") + std::string(); };
  std::string out = "Memory growth from " + base_name + " to " + cur_name + ":\n";
  out += "  live bytes  " + HumanBytes(tb.bytes) + " -> " + HumanBytes(tc.bytes) + "  (" + sign(tc.bytes - tb.bytes) +
         HumanBytes(tc.bytes - tb.bytes) + ")\n";
  out += "  allocations " + WithCommas(tb.count) + " -> " + WithCommas(tc.count) + "  (" + sign(tc.count - tb.count) +
         WithCommas(tc.count - tb.count) + ")\n\n";
  auto table = [&](const char* title, bool grow) {
    std::vector<const Row*> sel;
    for (const Row& r : rows)
      if (grow ? r.dbytes() > 0 || (r.dbytes() == 0 && r.after.count > r.before.count) : r.dbytes() < 0) sel.push_back(&r);
    if (!grow) std::reverse(sel.begin(), sel.end());
    if (sel.empty()) {
      out += std::string(title) + ": none\n";
      return;
    }
    out += Line("%s (top %zu of %zu):\n", title, std::min(top, sel.size()), sel.size());
    out += Line("  %12s %12s %21s  %s\n", "bytes", "allocations", "before -> after", "call site");
    for (size_t i = 0; i < sel.size() && i < top; ++i) {
      const Row& r = *sel[i];
      std::string ba = HumanBytes(r.before.bytes) + " -> " + HumanBytes(r.after.bytes);
      out += Line("  %12s %12s %21s  ", (sign(r.dbytes()) + HumanBytes(r.dbytes())).c_str(),
                  (sign(r.after.count - r.before.count) + WithCommas(r.after.count - r.before.count)).c_str(), ba.c_str());
      out += r.site + "\n";
    }
  };
  table("Grew", true);
  out += "\n";
  table("Shrank", false);
  return out;
}

}  // namespace spyglass::memory
