#include "memory/pprof.h"

#include "memory/call_site.h"

#include "common/gzip.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cctype>
#include <cstring>
#include <deque>
#include <limits>
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
// By hand on protobuf's CodedInputStream rather than generated profile.proto
// code: 1.5x faster, and every allocation is charged to one budget, where the
// generated parser builds ~120 bytes per 2-byte empty sample without a bound
// (BENCHMARKS.md "pprof").
namespace {

Status Bad(const std::string& what) {
  return InvalidArgumentError("not a valid pprof profile: " + what);
}

std::string Mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// What a profile may use while it is read: decompressed bytes and parsed
// structures are charged against options.max_bytes.
class Budget {
 public:
  explicit Budget(size_t max) : left_(max), max_(max) {}
  bool take(size_t n) {
    if (n > left_) over_ = true;
    if (over_) return false;
    left_ -= n;
    return true;
  }
  size_t left() const { return left_; }
  bool over() const { return over_; }
  Status exceeded(const char* what) const {
    return InvalidArgumentError(std::string("the profile is too large: ") + what + " exceeds the limit of " +
                                Mib(max_) + " (--max-profile-mb, $SPYGLASS_MAX_PROFILE_MB)");
  }

 private:
  size_t left_, max_;
  bool over_ = false;
};

// Inflates `in` into *out, stopping with an error past the budget.
Status Gunzip(std::string_view in, Budget& budget, std::string* out) {
  std::string detail;
  switch (GzipDecompress(in, budget.left(), out, &detail)) {
    case GunzipResult::kOk: break;
    case GunzipResult::kTooLarge: return budget.exceeded("the decompressed data");
    case GunzipResult::kTruncated: return Bad("the gzip data is truncated");
    case GunzipResult::kCorrupt: return Bad("the gzip data is corrupt (" + detail + ")");
  }
  if (!budget.take(out->size())) return budget.exceeded("the decompressed data");
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

// Rough heap cost of one hash or tree node beyond its value.
constexpr size_t kNodeCost = 48;

// Reads a varint field value or a packed run into `out`.
template <typename T>
bool ReadRepeatedVarint(CodedInputStream& in, uint32_t wire, Budget& budget, std::vector<T>* out) {
  uint64_t v;
  if (wire == kVarint) {
    if (!in.ReadVarint64(&v) || !budget.take(sizeof(T))) return false;
    out->push_back(static_cast<T>(v));
    return true;
  }
  if (wire != kLen) return false;
  uint32_t len;
  if (!in.ReadVarint32(&len) || static_cast<int>(len) < 0) return false;
  auto limit = in.PushLimit(static_cast<int>(len));
  while (in.BytesUntilLimit() > 0) {
    if (!in.ReadVarint64(&v) || !budget.take(sizeof(T))) return false;
    out->push_back(static_cast<T>(v));
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
      return in.ReadVarint32(&len) && static_cast<int>(len) >= 0 && in.Skip(static_cast<int>(len));
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

// Owns the serialized profile the views of a PprofProfile point into, and the
// text of numeric labels.
struct Storage {
  std::string bytes;
  std::deque<std::string> numbers;
};

Status ParseOwned(std::string bytes, Budget& budget, PprofProfile* out) {
  *out = PprofProfile{};
  if (bytes.empty()) return Bad("the file is empty");
  auto storage = std::make_shared<Storage>();
  if (IsGzip(bytes)) {
    if (Status s = Gunzip(bytes, budget, &storage->bytes); !s.ok()) return s;
    std::string().swap(bytes);
  } else {
    if (!budget.take(bytes.size())) return budget.exceeded("the file");
    storage->bytes = std::move(bytes);
  }
  std::string_view data = storage->bytes;
  if (data.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
    return Bad("the data is over 2 GiB, which protobuf cannot hold");
  CodedInputStream in(reinterpret_cast<const uint8_t*>(data.data()), static_cast<int>(data.size()));
  std::vector<std::pair<int64_t, int64_t>> sample_types;
  std::vector<RawSample> samples;
  std::unordered_map<uint64_t, std::vector<RawLine>> locations;
  std::unordered_map<uint64_t, RawFunction> functions;
  std::vector<std::string_view> strings;
  std::vector<uint64_t> comments;
  bool ok = true;
  auto take = [&](size_t n) { return ok = ok && budget.take(n); };
  while (ok) {
    uint32_t tag = in.ReadTag();
    if (tag == 0) {
      ok = in.CurrentPosition() == static_cast<int>(data.size());
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
      if (take(sizeof(sample_types[0]))) sample_types.emplace_back(type, unit);
    } else if (field == kProfileSample && wire == kLen) {
      RawSample s;
      ok = take(sizeof s) && ForEachField(in, [&](uint32_t f, uint32_t w) {
        if (f == 1) return ReadRepeatedVarint(in, w, budget, &s.locs);
        if (f == 2) return ReadRepeatedVarint(in, w, budget, &s.values);
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
          return r && budget.take(sizeof l);
        }
        return SkipField(in, (f << 3) | w);
      });
      if (ok) samples.push_back(std::move(s));
    } else if (field == kProfileLocation && wire == kLen) {
      uint64_t id = 0;
      std::vector<RawLine> lines;
      ok = take(kNodeCost) && ForEachField(in, [&](uint32_t f, uint32_t w) {
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
          return r && budget.take(sizeof l);
        }
        return SkipField(in, (f << 3) | w);
      });
      if (ok && id == 0) return Bad("a location has the reserved id 0");
      if (ok && !locations.emplace(id, std::move(lines)).second) return Bad("two locations share id " + std::to_string(id));
    } else if (field == kProfileFunction && wire == kLen) {
      uint64_t id = 0, v = 0;
      RawFunction fn;
      ok = take(kNodeCost) && ForEachField(in, [&](uint32_t f, uint32_t w) {
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
      // A view into the data: a string referenced many times is stored once.
      uint32_t len;
      ok = in.ReadVarint32(&len) && static_cast<int>(len) >= 0 && take(sizeof(std::string_view));
      int pos = in.CurrentPosition();
      ok = ok && in.Skip(static_cast<int>(len));
      if (ok) strings.push_back(data.substr(static_cast<size_t>(pos), len));
    } else if (field == kProfileComment) {
      ok = ReadRepeatedVarint(in, wire, budget, &comments);
    } else if (field == kProfileTimeNanos && wire == kVarint) {
      uint64_t v;
      ok = in.ReadVarint64(&v);
      out->time_nanos = static_cast<int64_t>(v);
    } else {
      ok = SkipField(in, tag);
    }
  }
  if (budget.over()) return budget.exceeded("the parsed profile");
  if (!ok) return Bad("the protobuf data is truncated or corrupt");
  if (strings.empty() || !strings[0].empty()) return Bad("string_table[0] must be \"\" (is this a pprof file?)");
  if (sample_types.empty()) return Bad("no sample types");
  auto str = [&](int64_t i, std::string_view* s) {
    if (i < 0 || static_cast<size_t>(i) >= strings.size()) return false;
    *s = strings[static_cast<size_t>(i)];
    return true;
  };
  for (size_t i = 0; i < sample_types.size(); ++i) {
    std::string_view t, u;
    if (!str(sample_types[i].first, &t) || !str(sample_types[i].second, &u)) return Bad("a string index is out of range");
    std::string_view base = t.substr(t.rfind("inuse_", 0) == 0 ? 6 : 0);
    if (base == "allocations" || base == "objects") out->count_index = static_cast<int>(i);
    if (base == "space") out->bytes_index = static_cast<int>(i);
    if (!budget.take(sizeof(out->sample_types[0]) + t.size() + u.size())) return budget.exceeded("the sample types");
    out->sample_types.emplace_back(t, u);
  }
  if (out->bytes_index < 0) out->bytes_index = static_cast<int>(sample_types.size()) - 1;
  if (!budget.take(samples.size() * sizeof(PprofSample))) return budget.exceeded("the parsed profile");
  out->samples.reserve(samples.size());
  for (RawSample& rs : samples) {
    if (rs.values.size() != sample_types.size())
      return Bad("a sample has " + std::to_string(rs.values.size()) + " values vs. " +
                 std::to_string(sample_types.size()) + " sample types");
    PprofSample s;
    s.values = std::move(rs.values);
    // Frames are the expansion a small file can ask for (ids x lines): charged
    // before they are made.
    std::vector<const std::vector<RawLine>*> locs;
    size_t frames = 0;
    if (!budget.take(rs.locs.size() * sizeof(locs[0]))) return budget.exceeded("the expanded stacks");
    locs.reserve(rs.locs.size());
    for (uint64_t id : rs.locs) {
      auto it = locations.find(id);
      if (it == locations.end()) return Bad("a sample refers to missing location " + std::to_string(id));
      locs.push_back(&it->second);
      frames += it->second.size();
      if (frames > budget.left() / sizeof(PprofFrame)) return budget.exceeded("the expanded stacks");
    }
    budget.take(frames * sizeof(PprofFrame));
    s.frames.reserve(frames);
    for (const std::vector<RawLine>* lines : locs) {
      for (const RawLine& l : *lines) {
        auto f = functions.find(l.function_id);
        if (f == functions.end()) return Bad("a location refers to missing function " + std::to_string(l.function_id));
        PprofFrame fr;
        if (!str(f->second.name, &fr.function) || !str(f->second.filename, &fr.file))
          return Bad("a string index is out of range");
        fr.line = l.line;
        s.frames.push_back(fr);
      }
    }
    for (const RawLabel& l : rs.labels) {
      std::string_view k, v;
      if (!str(l.key, &k) || !str(l.str, &v)) return Bad("a string index is out of range");
      if (!budget.take(kNodeCost + sizeof(std::string))) return budget.exceeded("the labels");
      if (l.str == 0) v = storage->numbers.emplace_back(std::to_string(l.num));
      s.labels[k] = v;
    }
    out->samples.push_back(std::move(s));
  }
  for (uint64_t c : comments) {
    std::string_view text;
    if (!str(static_cast<int64_t>(c), &text)) return Bad("a comment's string index is out of range");
    out->comments.push_back(text);
  }
  out->storage = std::move(storage);
  return Status::Ok();
}

}  // namespace

Status ParsePprof(std::string_view bytes, PprofProfile* out, const PprofReadOptions& options) {
  Budget budget(options.max_bytes);
  if (bytes.size() > options.max_bytes) return budget.exceeded("the input");
  return ParseOwned(std::string(bytes), budget, out);
}

Status ReadPprofFile(const std::string& path, PprofProfile* out, const PprofReadOptions& options) {
  *out = PprofProfile{};
  auto fail = [&](Status s) { return Status(s.code(), path + ": " + s.message()); };
  // O_NONBLOCK: opening a FIFO otherwise waits for a writer, for ever.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    std::string why = "cannot open " + path + ": " + std::strerror(err);
    return err == ENOENT ? NotFoundError(why) : InvalidArgumentError(why);
  }
  struct stat st {};
  std::string bytes;
  Status s = Status::Ok();
  if (fstat(fd, &st) != 0) {
    s = InvalidArgumentError("cannot stat the file");
  } else if (!S_ISREG(st.st_mode)) {
    s = InvalidArgumentError(S_ISDIR(st.st_mode)    ? "is a directory, not a profile file"
                             : S_ISFIFO(st.st_mode) ? "is a FIFO, not a profile file (copy it to a file first)"
                                                    : "is not a regular file, not a profile file");
  } else {
    // Read until the end, at most one byte past the limit (st_size is only a
    // hint: a file that grows or shrinks while it is read, /proc).
    size_t limit = options.max_bytes;
    if (S_ISREG(st.st_mode)) bytes.reserve(std::min(static_cast<size_t>(st.st_size), limit) + 1);
    char buf[1 << 16];
    while (s.ok()) {
      ssize_t n = read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) s = InvalidArgumentError(std::string("cannot read: ") + std::strerror(errno));
      if (n <= 0) break;
      if (bytes.size() + static_cast<size_t>(n) > limit) s = Budget(limit).exceeded("the file");
      else bytes.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  if (!s.ok()) return fail(s);
  Budget budget(options.max_bytes);
  s = ParseOwned(std::move(bytes), budget, out);
  return s.ok() ? s : fail(s);
}

// ---- reports ----------------------------------------------------------------------
namespace {

// Names are cut to this many bytes when printed; scans for a plumbing prefix
// or a basename look no further either (a name may be megabytes).
constexpr size_t kMaxShown = 120;
constexpr size_t kMaxScan = 4096;

std::string Shown(std::string_view s) {
  if (s.size() <= kMaxShown) return std::string(s);
  return std::string(s.substr(0, kMaxShown - 3)) + "...";
}

// JAX's own Python frames (jax and jaxlib, installed or in a source tree).
// A JAX program's heap profile records each buffer's stack from inside JAX
// (dispatch, pxla, ...): the call site is the frame that called into it.
bool IsJaxFrame(const PprofFrame& f) {
  for (std::string_view part : {"/site-packages/jax/", "/dist-packages/jax/", "/site-packages/jaxlib/",
                                "/dist-packages/jaxlib/", "/jax/_src/"})
    if (f.file.find(part) != std::string_view::npos) return true;
  return false;
}

std::string_view Basename(std::string_view p) {
  if (p.size() > kMaxScan) p = p.substr(p.size() - kMaxScan);
  size_t s = p.rfind('/');
  return s == std::string_view::npos ? p : p.substr(s + 1);
}

std::string FrameText(const PprofFrame& f) {
  std::string out = Shown(f.function);
  if (!f.file.empty()) {
    out += "  " + Shown(Basename(f.file));
    if (f.line > 0) out += ":" + std::to_string(f.line);
  }
  return out;
}

uint64_t Magnitude(int64_t v) { return v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v); }

std::string WithCommas(int64_t v) {
  std::string digits = std::to_string(Magnitude(v)), out = v < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Sums that stick at the int64 limits instead of wrapping, and remember it.
struct Totals {
  int64_t bytes = 0, count = 0;
};
struct Checks {
  bool saturated = false;
  size_t negative = 0;  // samples with a negative bytes or count value
};
int64_t SatAdd(int64_t a, int64_t b, Checks* c) {
  int64_t r;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  c->saturated = true;
  return b > 0 ? INT64_MAX : INT64_MIN;
}
int64_t SatSub(int64_t a, int64_t b, Checks* c) {
  int64_t r;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  c->saturated = true;
  return b < 0 ? INT64_MAX : INT64_MIN;
}

int64_t Value(const PprofSample& s, int idx) {
  return idx >= 0 && static_cast<size_t>(idx) < s.values.size() ? s.values[static_cast<size_t>(idx)] : 0;
}

void Add(Totals* t, const PprofProfile& p, const PprofSample& s, Checks* c) {
  t->bytes = SatAdd(t->bytes, Value(s, p.bytes_index), c);
  t->count = SatAdd(t->count, Value(s, p.count_index), c);
}

std::map<std::string, Totals> BySite(const PprofProfile& p, Totals* total, Checks* c, const SiteOptions& o) {
  std::map<std::string, Totals> out;
  for (const PprofSample& s : p.samples) {
    if (Value(s, p.bytes_index) < 0 || Value(s, p.count_index) < 0) ++c->negative;
    Add(&out[CallSite(s, o)], p, s, c);
    Add(total, p, s, c);
  }
  return out;
}

std::string Warnings(const Checks& c, const std::string& name) {
  std::string out;
  if (c.negative)
    out += "warning: " + name + " has " + std::to_string(c.negative) +
           " samples with negative values (not a live-memory profile?); they are summed as given\n";
  if (c.saturated) out += "warning: sums overflow 64 bits; they are shown at the limit (about 8 EiB)\n";
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
  uint64_t m = Magnitude(bytes);
  const char* sign = bytes < 0 ? "-" : "";
  if (m < 1024) return Line("%s%llu B", sign, static_cast<unsigned long long>(m));
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(m);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  return Line("%s%.1f %s", sign, v, units[u]);
}

std::string CallSite(const PprofSample& s, const SiteOptions& o) {
  if (s.frames.empty()) return "<no stack>";
  size_t first = 0;
  if (o.frames == 0) {
    first = 0;  // the whole stack, plumbing included
  } else {
    size_t native = s.frames.size(), python = s.frames.size();
    for (size_t i = 0; i < s.frames.size() && native == s.frames.size(); ++i)
      if (!IsPlumbing(s.frames[i].function) && !IsAllocatorWrapper(s.frames[i].function)) native = i;
    for (size_t i = 0; i < s.frames.size() && python == s.frames.size(); ++i)
      if (IsPythonSource(s.frames[i].file)) python = i;
    if (python < s.frames.size() && IsJaxFrame(s.frames[python])) {
      size_t caller = python;
      while (caller < s.frames.size() && IsJaxFrame(s.frames[caller])) ++caller;
      if (caller < s.frames.size()) python = caller;  // all JAX's: its innermost frame
    }
    first = !o.native && python < s.frames.size() ? python : native < s.frames.size() ? native : 0;
  }
  const size_t end = o.frames == 0 ? s.frames.size() : std::min(s.frames.size(), first + static_cast<size_t>(o.frames));
  std::string out;
  for (size_t i = first; i < end; ++i) {
    if (i > first) out += " <- ";
    out += FrameText(s.frames[i]);
  }
  return out;
}

std::string MemTopReport(const PprofProfile& p, const std::string& name, size_t top, const SiteOptions& o) {
  Totals total;
  Checks checks;
  std::map<std::string, Totals> sites = BySite(p, &total, &checks, o);
  std::map<std::string, Totals> devices;
  for (const PprofSample& s : p.samples) {
    auto get = [&](std::string_view k) {
      auto it = s.labels.find(k);
      return it == s.labels.end() ? std::string("-") : Shown(it->second);
    };
    Add(&devices[get("device") + "  " + get("kind")], p, s, &checks);
  }
  std::string out = Warnings(checks, name);
  if (!out.empty()) out += "\n";
  out += "Live memory in " + name + ": " + HumanBytes(total.bytes) + " in " + WithCommas(total.count) +
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
                          const std::string& cur_name, size_t top, const SiteOptions& o) {
  Totals tb, tc;
  Checks cb, cc, checks;
  std::map<std::string, Totals> b = BySite(base, &tb, &cb, o), c = BySite(cur, &tc, &cc, o);
  struct Row {
    std::string site;
    Totals before, after;
    int64_t dbytes = 0, dcount = 0;
  };
  std::vector<Row> rows;
  auto row = [&](const std::string& site, Totals before, Totals after) {
    rows.push_back({site, before, after, SatSub(after.bytes, before.bytes, &checks),
                    SatSub(after.count, before.count, &checks)});
  };
  for (const auto& [k, t] : c) row(k, b.count(k) ? b[k] : Totals{}, t);
  for (const auto& [k, t] : b)
    if (!c.count(k)) row(k, t, Totals{});
  std::sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return x.dbytes > y.dbytes; });
  auto sign = [](int64_t v) { return (v > 0 ? "+" : "") + std::string(); };
  int64_t dbytes = SatSub(tc.bytes, tb.bytes, &checks), dcount = SatSub(tc.count, tb.count, &checks);
  checks.saturated |= cb.saturated || cc.saturated;
  cb.saturated = cc.saturated = false;
  std::string out = Warnings(cb, base_name) + Warnings(cc, cur_name) + Warnings(checks, cur_name);
  if (!out.empty()) out += "\n";
  out += "Memory growth from " + base_name + " to " + cur_name + ":\n";
  out += "  live bytes  " + HumanBytes(tb.bytes) + " -> " + HumanBytes(tc.bytes) + "  (" + sign(dbytes) +
         HumanBytes(dbytes) + ")\n";
  out += "  allocations " + WithCommas(tb.count) + " -> " + WithCommas(tc.count) + "  (" + sign(dcount) +
         WithCommas(dcount) + ")\n\n";
  auto table = [&](const char* title, bool grow) {
    std::vector<const Row*> sel;
    for (const Row& r : rows)
      if (grow ? r.dbytes > 0 || (r.dbytes == 0 && r.dcount > 0) : r.dbytes < 0) sel.push_back(&r);
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
      out += Line("  %12s %12s %21s  ", (sign(r.dbytes) + HumanBytes(r.dbytes)).c_str(),
                  (sign(r.dcount) + WithCommas(r.dcount)).c_str(), ba.c_str());
      out += r.site + "\n";
    }
  };
  table("Grew", true);
  out += "\n";
  table("Shrank", false);
  return out;
}

}  // namespace spyglass::memory
