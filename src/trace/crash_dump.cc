#include "trace/crash_dump.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/signal_safe.h"
#include "trace/recorder.h"

// Everything here runs in a fatal-signal handler: only async-signal-safe
// calls (write, openat, mkdirat, renameat, clock_gettime), static storage
// (in .bss: untouched, so not resident, until a crash), no lock.
namespace spyglass::internal {
namespace {

// Protobuf output: counts bytes (no buffer) or writes them to a file.
struct Out : signal_safe::FdWriter {
  using FdWriter::FdWriter;
  void varint(uint64_t v) {
    uint8_t b[10];
    int i = 0;
    while (v >= 0x80) {
      b[i++] = static_cast<uint8_t>(v | 0x80);
      v >>= 7;
    }
    b[i++] = static_cast<uint8_t>(v);
    Put(b, i);
  }
  void tag(uint32_t field, int wire) { varint((uint64_t{field} << 3) | wire); }
  void vfield(uint32_t field, uint64_t v) {
    tag(field, 0);
    varint(v);
  }
  void header(uint32_t field, uint64_t len) {
    tag(field, 2);
    varint(len);
  }
  void sfield(uint32_t field, const char* s, size_t len) {
    header(field, len);
    Put(s, len);
  }
  void dfield(uint32_t field, double d) {
    tag(field, 1);
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    uint8_t le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<uint8_t>(bits >> (8 * i));
    Put(le, 8);
  }
};

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

size_t BoundedLen(const char* s, size_t max) {
  size_t n = 0;
  while (n < max && s[n] != '\0') ++n;
  return n;
}

// Interned names: event names (by pointer for static ones, by content for
// copied ones) and argument keys. Id = slot + 1; a full table maps the rest
// to one overflow entry.
struct NameSlot {
  uint64_t key;
  const char* s;
  uint32_t len;
  bool used;
};
template <size_t N>
struct NameTable {
  NameSlot slots[N];
  static constexpr uint64_t kOverflowId = N + 1;
  bool overflowed = false;

  uint64_t Intern(uint64_t key, const char* s, uint32_t len, bool by_content) {
    for (size_t i = 0; i < N; ++i) {
      NameSlot& slot = slots[(key + i) % N];
      if (!slot.used) {
        slot = {key, s, len, true};
        return (key + i) % N + 1;
      }
      if (slot.key == key && (!by_content || (slot.len == len && std::memcmp(slot.s, s, len) == 0)))
        return (key + i) % N + 1;
    }
    overflowed = true;
    return kOverflowId;
  }
};

uint64_t Fnv(const char* s, size_t len) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; ++i) h = (h ^ static_cast<uint8_t>(s[i])) * 1099511628211ull;
  return h;
}

constexpr size_t kMaxThreads = 1024;
constexpr size_t kMaxSpans = 1 << 16;

struct ThreadRec {
  int64_t tid;
  const char* name;
  uint64_t overwritten;
  size_t first_span, spans;
};

// The state of one crash dump, all static.
struct State {
  UnlockedView view;
  ThreadRec threads[kMaxThreads];
  size_t thread_count;
  const uint64_t* span_begin[kMaxSpans];
  const uint64_t* span_end[kMaxSpans];
  size_t span_count;
  NameTable<1 << 14> events;
  NameTable<1 << 10> keys;
  char buf[1 << 16];
  // The window, in ticks, and its conversion to the XSpace's times.
  uint64_t since_ticks, crash_ticks, base_wall_ns;
  double ns_per_tick;
  uint64_t overwritten;
};
State g;

void Collect(const UnlockedView& v, void*) {
  if (g.thread_count == kMaxThreads) return;
  ThreadRec& t = g.threads[g.thread_count++];
  t = {v.tid, v.name, v.overwritten, g.span_count, 0};
  g.overwritten += v.overwritten;
  for (size_t i = 0; i < v.spans && g.span_count < kMaxSpans; ++i) {
    g.span_begin[g.span_count] = v.span_begin[i];
    g.span_end[g.span_count] = v.span_end[i];
    ++g.span_count;
    ++t.spans;
  }
}

// A position in a thread's records.
struct Cursor {
  size_t span, last;  // span index; one past the thread's last
  const uint64_t* p;

  bool valid() const { return span < last; }
  size_t words() const {
    size_t w = record_words(*p);
    return w == 0 || p + w > g.span_end[span] ? 0 : w;
  }
  void settle() {  // onto a record, or past the end
    while (span < last && (p >= g.span_end[span] || words() == 0)) {
      ++span;
      if (span < last) p = g.span_begin[span];
    }
  }
  void next() {
    p += words();
    settle();
  }
};

Cursor Start(const ThreadRec& t) {
  Cursor c{t.first_span, t.first_span + t.spans, t.spans ? g.span_begin[t.first_span] : nullptr};
  c.settle();
  return c;
}

bool IsBegin(uint64_t w) {
  uint64_t tag = w >> 56;
  return !(w & kEndBit) && (tag == kTagStatic || tag == kTagCopied);
}
uint64_t BeginTicks(const uint64_t* p) {
  return (*p >> 56) == kTagStatic ? p[1] : p[1 + words_for(*p & kPayloadMask)];
}
int64_t ToPs(uint64_t ticks) {
  if (ticks <= g.since_ticks) return 0;
  return static_cast<int64_t>(static_cast<double>(ticks - g.since_ticks) * g.ns_per_tick * 1000.0);
}

constexpr uint64_t kIncompleteKeyId = decltype(g.keys)::kOverflowId + 1;
constexpr uint64_t kOverwrittenKeyId = kIncompleteKeyId + 1;
constexpr uint64_t kPidKeyId = kIncompleteKeyId + 2;

// XStat of an argument record at `p`: 1 metadata_id, 2 double, 3 uint64, 4 int64, 5 str.
void ArgStat(Out& o, const uint64_t* p) {
  uint64_t w = *p;
  auto type = static_cast<ArgType>((w >> 48) & 0xff);
  size_t klen = (w >> 32) & 0xffff, vlen = w & 0xffffffff;
  const char* key = reinterpret_cast<const char*>(p + 1);
  const uint64_t* v = p + 1 + words_for(klen);
  uint64_t id = g.keys.Intern(Fnv(key, klen), key, static_cast<uint32_t>(klen), true);
  size_t size = 1 + VarintSize(id);
  switch (type) {
    case ArgType::kInt64:
    case ArgType::kUint64: size += 1 + VarintSize(*v); break;
    case ArgType::kDouble: size += 9; break;
    case ArgType::kString: size += 1 + VarintSize(vlen) + vlen; break;
  }
  o.header(4, size);
  o.vfield(1, id);
  switch (type) {
    case ArgType::kInt64: o.vfield(4, *v); break;
    case ArgType::kUint64: o.vfield(3, *v); break;
    case ArgType::kDouble: {
      double d;
      std::memcpy(&d, v, 8);
      o.dfield(2, d);
      break;
    }
    case ArgType::kString: o.sfield(5, reinterpret_cast<const char*>(v), vlen); break;
  }
}

// XEvent body: 1 metadata_id, 2 offset_ps, 3 duration_ps, 4 stats. The
// event's arguments and end are found by scanning on from its begin.
void EventBody(Out& o, Cursor at) {
  const uint64_t* p = at.p;
  uint64_t id;
  if ((*p >> 56) == kTagStatic) {
    const char* name = reinterpret_cast<const char*>(*p & kPayloadMask);
    id = g.events.Intern(*p & kPayloadMask, name, static_cast<uint32_t>(BoundedLen(name, kMaxStringBytes)), false);
  } else {
    const char* name = reinterpret_cast<const char*>(p + 1);
    size_t len = *p & kPayloadMask;
    id = g.events.Intern(Fnv(name, len), name, static_cast<uint32_t>(len), true);
  }
  uint64_t begin = BeginTicks(p);
  o.vfield(1, id);
  o.vfield(2, static_cast<uint64_t>(ToPs(begin)));
  uint64_t end = 0;
  int depth = 0;
  for (at.next(); at.valid(); at.next()) {
    uint64_t w = *at.p;
    if (w & kEndBit) {
      if (depth == 0) {
        end = w & ~kEndBit;
        break;
      }
      --depth;
    } else if (IsBegin(w)) {
      ++depth;
    } else if (depth == 0) {
      ArgStat(o, at.p);
    }
  }
  if (end == 0) {  // still open at the crash
    end = g.crash_ticks;
    o.header(4, 3 + VarintSize(kIncompleteKeyId));  // {1 id, 4 int64 1}
    o.vfield(1, kIncompleteKeyId);
    o.vfield(4, 1);
  }
  o.vfield(3, static_cast<uint64_t>(ToPs(end > begin ? end : begin) - ToPs(begin)));
}

// XLine body: 1 id, 2 name, 3 timestamp_ns, 4 events.
void LineBody(Out& o, const ThreadRec& t) {
  o.vfield(1, static_cast<uint64_t>(t.tid));
  if (t.name != nullptr) o.sfield(2, t.name, BoundedLen(t.name, 256));
  o.vfield(3, g.base_wall_ns);
  for (Cursor c = Start(t); c.valid(); c.next()) {
    if (!IsBegin(*c.p) || BeginTicks(c.p) < g.since_ticks) continue;
    Out count;
    EventBody(count, c);
    o.header(4, count.count());
    EventBody(o, c);
  }
}

void MetadataEntry(Out& o, uint32_t field, uint64_t id, const char* name, size_t len) {
  size_t md = 1 + VarintSize(id) + 1 + VarintSize(len) + len;  // {1 id, 2 name}
  o.header(field, 1 + VarintSize(id) + 1 + VarintSize(md) + md);  // map entry {1 key, 2 value}
  o.vfield(1, id);
  o.header(2, md);
  o.vfield(1, id);
  o.sfield(2, name, len);
}

// XPlane body: 2 name, 3 lines, 4 event_metadata, 5 stat_metadata, 6 stats.
void PlaneBody(Out& o, int64_t pid) {
  static const char kName[] = "/host:CPU";
  o.sfield(2, kName, sizeof kName - 1);
  for (size_t i = 0; i < g.thread_count; ++i) {
    Out count;
    LineBody(count, g.threads[i]);
    o.header(3, count.count());
    LineBody(o, g.threads[i]);
  }
  for (size_t i = 0; i < std::size(g.events.slots); ++i) {
    const NameSlot& s = g.events.slots[i];
    if (s.used) MetadataEntry(o, 4, i + 1, s.s, s.len);
  }
  if (g.events.overflowed) MetadataEntry(o, 4, g.events.kOverflowId, "?", 1);
  for (size_t i = 0; i < std::size(g.keys.slots); ++i) {
    const NameSlot& s = g.keys.slots[i];
    if (s.used) MetadataEntry(o, 5, i + 1, s.s, s.len);
  }
  if (g.keys.overflowed) MetadataEntry(o, 5, g.keys.kOverflowId, "?", 1);
  MetadataEntry(o, 5, kIncompleteKeyId, "incomplete", 10);
  MetadataEntry(o, 5, kOverwrittenKeyId, "overwritten_events", 18);
  MetadataEntry(o, 5, kPidKeyId, "process_id", 10);
  o.header(6, 2 + VarintSize(kOverwrittenKeyId) + VarintSize(g.overwritten));
  o.vfield(1, kOverwrittenKeyId);
  o.vfield(3, g.overwritten);
  o.header(6, 2 + VarintSize(kPidKeyId) + VarintSize(static_cast<uint64_t>(pid)));
  o.vfield(1, kPidKeyId);
  o.vfield(4, static_cast<uint64_t>(pid));
}

// "spyglass: ... signal NN ..." without snprintf.
size_t Warning(char* out, size_t cap, int sig) {
  signal_safe::Text t{out, cap};
  t.Add("spyglass: written by the flight recorder when the process got fatal signal ");
  t.AddDecimal(static_cast<unsigned>(sig));
  t.Add("; host events only, from the crash handler");
  return t.len;
}

}  // namespace

// "/proc/self/fd/<fd>" into out (signal-safe).
static void ProcFdPath(int fd, char* out, size_t cap) {
  static const char kPrefix[] = "/proc/self/fd/";
  char digits[16];
  int n = 0;
  unsigned v = static_cast<unsigned>(fd);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && n < 16);
  size_t len = sizeof kPrefix - 1;
  std::memcpy(out, kPrefix, len);
  while (n > 0 && len + 1 < cap) out[len++] = digits[--n];
  out[len] = '\0';
}

bool WriteCrashRun(const CrashTarget& t, int sig, const char** why) {
  static const char* ignored;
  if (why == nullptr) why = &ignored;
  *why = "";
  if (t.dir.fd < 0) {
    *why = "no crash file was prepared";
    return false;
  }
  if (!kept_fd::IsOurs(t.dir)) {
    *why = "the program closed or reused the descriptor of the profile directory";
    return false;
  }
  g.thread_count = 0;
  g.span_count = 0;
  g.overwritten = 0;
  recorder_visit_unlocked(t.word, &g.view, Collect, nullptr);

  g.crash_ticks = now_ticks();
  uint64_t mono = signal_safe::ClockNs(CLOCK_MONOTONIC), wall = signal_safe::ClockNs(CLOCK_REALTIME);
  g.ns_per_tick = t.ns_per_tick;
  if (mono - t.start_mono_ns > 1000000000ull && g.crash_ticks > t.start_ticks)  // a longer span measures better
    g.ns_per_tick = static_cast<double>(mono - t.start_mono_ns) / static_cast<double>(g.crash_ticks - t.start_ticks);
  uint64_t span = static_cast<uint64_t>(static_cast<double>(t.ring_seconds) * 1e9 / g.ns_per_tick);
  g.since_ticks = g.crash_ticks - t.start_ticks > span ? g.crash_ticks - span : t.start_ticks;
  g.base_wall_ns = wall - static_cast<uint64_t>(static_cast<double>(g.crash_ticks - g.since_ticks) * g.ns_per_tick);

  // The plane's size first (this pass also names every event), then the bytes.
  Out count;
  PlaneBody(count, t.pid);
  char warning[160];
  const size_t warning_len = Warning(warning, sizeof warning, sig);
  auto write_space = [&](int fd) {
    Out o(fd, g.buf, sizeof g.buf);
    o.header(1, count.count());
    PlaneBody(o, t.pid);
    o.sfield(3, warning, warning_len);
    o.sfield(4, t.hostname, BoundedLen(t.hostname, sizeof t.hostname));
    o.Flush();
    return !o.failed();
  };
  // A named file made now, in place of the one kept (or after it could not be linked).
  auto write_named = [&]() {
    int fd = openat(t.dir.fd, t.tmp_name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    bool ok = write_space(fd);
    close(fd);
    if (!ok) unlinkat(t.dir.fd, t.tmp_name, 0);
    return ok;
  };

  const bool file_ours = kept_fd::IsOurs(t.file);
  bool named = !file_ours || t.file_named;
  bool written = file_ours ? write_space(t.file.fd) : write_named();
  if (!written) {
    if (file_ours && t.file_named) unlinkat(t.dir.fd, t.tmp_name, 0);
    *why = file_ours ? "writing the crash file failed"
                     : "the program took the crash file's descriptor, and a new crash file could not be written";
    return false;
  }

  if (mkdirat(t.dir.fd, t.run_name, 0755) != 0 && errno != EEXIST) {
    if (named) unlinkat(t.dir.fd, t.tmp_name, 0);
    *why = "cannot make the run directory";
    return false;
  }
  int run = openat(t.dir.fd, t.run_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  bool ok = false;
  if (run >= 0) {
    if (named) {
      ok = renameat(t.dir.fd, t.tmp_name, run, t.file_name) == 0;
    } else {
      // An unnamed file gets its name through /proc (no capability needed),
      // else by AT_EMPTY_PATH (CAP_DAC_READ_SEARCH), else it is written again
      // under a name.
      char path[40];
      ProcFdPath(t.file.fd, path, sizeof path);
      ok = linkat(AT_FDCWD, path, run, t.file_name, AT_SYMLINK_FOLLOW) == 0 ||
           linkat(t.file.fd, "", run, t.file_name, AT_EMPTY_PATH) == 0;
      if (!ok && write_named()) {
        named = true;
        ok = renameat(t.dir.fd, t.tmp_name, run, t.file_name) == 0;
      }
    }
    close(run);
  }
  if (!ok) {
    if (named) unlinkat(t.dir.fd, t.tmp_name, 0);
    unlinkat(t.dir.fd, t.run_name, AT_REMOVEDIR);  // only if empty
    *why = "cannot put the crash file into its run directory";
  }
  return ok;
}

}  // namespace spyglass::internal
