#include "memory/crash_dump.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "common/kept_fd.h"
#include "common/signal_safe.h"
#include "memory/pprof.h"
#include "memory/symbolize.h"

namespace spyglass::memory::internal {
namespace {

constexpr char kMagic[8] = {'S', 'G', 'M', 'D', 'U', 'M', 'P', '1'};
struct DumpHeader {
  char magic[8];
  uint32_t version;
  uint32_t reason;
  int32_t signal;
  uint32_t pid;
  uint64_t failed_bytes;
  uint64_t sample_interval;
  uint32_t skipped_shards;
  uint32_t reserved;
  int64_t time_nanos;
  char comm[16];
};
enum Tag : uint32_t { kClass = 1, kFailedFrames = 2, kLive = 3, kSite = 4, kFunction = 5, kMaps = 6, kEnd = 7 };
struct LiveEntry {
  uint32_t site;
  uint32_t pad;
  uint64_t size;
};
constexpr uint32_t kMaxRecord = 1u << 20;  // the reader's bound on one record
constexpr uint32_t kSiteBits = 1u << 24;   // site ids are 24-bit

// ---- reserved at start: nothing below allocates ------------------------------------
kept_fd::KeptFd g_dir;  // kept high, checked before use (common/kept_fd.h)
uint64_t* g_site_bits = nullptr;      // sites referenced by live records
uint64_t* g_function_bits = nullptr;  // functions referenced by those sites
std::atomic<int> g_state{0};          // 0 none, 1 writing, 2 written
std::atomic<long> g_writer{0};        // thread writing it

char g_buf[64 << 10];
signal_safe::FdWriter g_out;  // the dump being written, through g_buf
LiveEntry g_live[2048];
uint32_t g_live_n = 0;

void Put(const void* p, size_t n) { g_out.Put(p, n); }
void Record(uint32_t tag, uint32_t len) {
  Put(&tag, 4);
  Put(&len, 4);
}
void FlushLive() {
  if (g_live_n == 0) return;
  Record(kLive, g_live_n * sizeof(LiveEntry));
  Put(g_live, g_live_n * sizeof(LiveEntry));
  g_live_n = 0;
}
void VisitLive(const LiveRecord& r, void*) {
  uint32_t site = r.site & (kSiteBits - 1);
  g_site_bits[site >> 6] |= uint64_t{1} << (site & 63);
  g_live[g_live_n++] = {site, 0, r.size};
  if (g_live_n == sizeof g_live / sizeof g_live[0]) FlushLive();
}

// Copies /proc/self/<what> into buf (NUL-terminated); its length.
size_t ReadProcSelf(const char* what, char* buf, size_t cap) {
  char path[64] = "/proc/self/";
  std::strncat(path, what, sizeof path - 12);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  size_t n = 0;
  if (fd >= 0) {
    while (n + 1 < cap) {
      ssize_t r = signal_safe::Read(fd, buf + n, cap - 1 - n);
      if (r <= 0) break;
      n += static_cast<size_t>(r);
    }
    close(fd);
  }
  buf[n] = '\0';
  return n;
}

}  // namespace

size_t FormatProfileName(char* out, size_t cap, const char* tag, const char* ext) {
  char comm[32];
  size_t cn = ReadProcSelf("comm", comm, sizeof comm);
  while (cn > 0 && (comm[cn - 1] == '\n' || comm[cn - 1] == ' ')) comm[--cn] = '\0';
  // As SafeComm (memory/timeline.h), which names the process's other files.
  for (size_t i = 0; i < cn; ++i) {
    char c = comm[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '+' || c == '-';
    if (!ok) comm[i] = '_';
  }
  if (cn == 0 || (cn == 1 && comm[0] == '.') || (cn == 2 && comm[0] == '.' && comm[1] == '.'))
    std::memcpy(comm, "unknown", cn = 7);
  if (cap == 0) return 0;
  signal_safe::Text t{out, cap - 1};
  t.Add("memory.");
  t.AddDecimal(static_cast<uint64_t>(getpid()));
  t.Add(".");
  t.Add(comm, cn);
  t.Add(".");
  t.Add(tag);
  t.Add(ext);
  out[t.len] = '\0';
  return t.len;
}

bool PrepareCrashDump(int dir_fd) {
  if (!g_site_bits) {
    void* s = mmap(nullptr, kSiteBits / 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* f = mmap(nullptr, kMaxFunctions / 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (s == MAP_FAILED || f == MAP_FAILED) return false;
    g_site_bits = static_cast<uint64_t*>(s);
    g_function_bits = static_cast<uint64_t*>(f);
  }
  g_dir = kept_fd::Keep(dir_fd);
  return g_dir.fd >= 0;
}

bool CrashDumpWritten() { return g_state.load() != 0; }

bool WriteCrashDump(DumpReason reason, int signal, const FailedAllocation* failed) {
  if (g_dir.fd < 0 || !g_site_bits) return false;
  if (!kept_fd::IsOurs(g_dir)) {
    // The program closed it and reused the number: writing "into" it would
    // write into the program's file. Said here, the only time it matters.
    static const char kTaken[] =
        "spyglass: memory dump not written: the program closed or reused the profile directory's descriptor\n";
    (void)!write(2, kTaken, sizeof kTaken - 1);
    g_state.store(2);
    return false;
  }
  const long me = syscall(SYS_gettid);
  int expected = 0;
  if (!g_state.compare_exchange_strong(expected, 1)) {
    // Another thread is writing it: let it finish (bounded) before this one
    // goes on to die; the same thread (a fault inside the dump) gives up.
    if (g_writer.load() != me)
      for (int i = 0; i < 1000 && g_state.load() == 1; ++i) {
        timespec ts{0, 10 * 1000 * 1000};
        nanosleep(&ts, nullptr);
      }
    return false;
  }
  g_writer.store(me);
  char name[160], tmp[176];
  FormatProfileName(name, sizeof name, reason == DumpReason::kOutOfMemory ? "oom" : "signal", ".raw");
  std::memcpy(tmp, name, std::strlen(name) + 1);
  std::strncat(tmp, ".tmp", sizeof tmp - std::strlen(tmp) - 1);
  unlinkat(g_dir.fd, tmp, 0);
  const int fd = openat(g_dir.fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    g_state.store(2);
    return false;
  }
  g_out = signal_safe::FdWriter(fd, g_buf, sizeof g_buf);
  DumpHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = 1;
  h.reason = static_cast<uint32_t>(reason);
  h.signal = signal;
  h.pid = static_cast<uint32_t>(getpid());
  h.failed_bytes = failed ? failed->bytes : 0;
  h.sample_interval = SampleInterval();
  h.time_nanos = static_cast<int64_t>(signal_safe::ClockNs(CLOCK_REALTIME));
  ReadProcSelf("comm", h.comm, sizeof h.comm);
  Put(&h, sizeof h);

  for (uint32_t c = 1; c <= ClassCount(); ++c) {
    std::string_view d = ClassDevice(c), k = ClassKind(c);
    uint8_t dl = static_cast<uint8_t>(d.size()), kl = static_cast<uint8_t>(k.size());
    Record(kClass, 4 + 2 + dl + kl);
    Put(&c, 4);
    Put(&dl, 1);
    Put(&kl, 1);
    Put(d.data(), dl);
    Put(k.data(), kl);
  }
  if (failed && failed->depth > 0) {
    Record(kFailedFrames, static_cast<uint32_t>(failed->depth) * 8);
    Put(failed->frames, static_cast<size_t>(failed->depth) * 8);
  }
  // Live records; a shard another thread holds is skipped (counted in the header).
  h.skipped_shards = ForEachLiveNoAlloc(VisitLive, nullptr);
  FlushLive();
  // The stacks they point at, then the functions of those stacks' symbolic frames.
  const uint32_t end = std::min(SiteIdEnd(), kSiteBits);
  for (uint32_t id = 0; id < end; ++id) {
    if (!(g_site_bits[id >> 6] >> (id & 63) & 1)) continue;
    const Site* s = GetSite(id);
    if (!s) continue;
    uint32_t depth = std::min<uint32_t>(s->depth, kMaxFrames);
    Record(kSite, 16 + depth * 8);
    uint32_t head[4] = {id, s->cls, depth, 0};
    Put(head, sizeof head);
    Put(s->frames, depth * 8);
    for (uint32_t i = 0; i < depth; ++i)
      if (IsSymbolicFrame(s->frames[i])) {
        uint32_t f = SymbolicFunction(s->frames[i]);
        if (f < kMaxFunctions) g_function_bits[f >> 6] |= uint64_t{1} << (f & 63);
      }
  }
  for (int i = 0; failed && i < failed->depth; ++i)  // the failed allocation's names too
    if (IsSymbolicFrame(failed->frames[i])) {
      uint32_t f = SymbolicFunction(failed->frames[i]);
      if (f < kMaxFunctions) g_function_bits[f >> 6] |= uint64_t{1} << (f & 63);
    }
  const uint32_t fend = std::min(FunctionIdEnd(), kMaxFunctions);
  for (uint32_t id = 0; id < fend; ++id) {
    if (!(g_function_bits[id >> 6] >> (id & 63) & 1)) continue;
    std::string_view fn, file;
    if (!FunctionNames(id, &fn, &file)) continue;
    uint32_t head[3] = {id, static_cast<uint32_t>(fn.size()), static_cast<uint32_t>(file.size())};
    Record(kFunction, static_cast<uint32_t>(sizeof head + fn.size() + file.size()));
    Put(head, sizeof head);
    Put(fn.data(), fn.size());
    Put(file.data(), file.size());
  }
  // The address space, in pieces (symbolization happens elsewhere, later).
  int maps = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (maps >= 0) {
    char chunk[16 << 10];
    for (ssize_t r; (r = signal_safe::Read(maps, chunk, sizeof chunk)) > 0;) {
      Record(kMaps, static_cast<uint32_t>(r));
      Put(chunk, static_cast<size_t>(r));
    }
    close(maps);
  }
  Record(kEnd, 0);
  g_out.Flush();
  // The header again, with the skipped shards now known.
  bool ok = !g_out.failed() && pwrite(fd, &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h);
  close(fd);
  ok = ok && renameat(g_dir.fd, tmp, g_dir.fd, name) == 0;
  if (!ok) unlinkat(g_dir.fd, tmp, 0);
  g_state.store(2);
  return ok;
}

// ---- reading a dump (spyglass run, afterwards) ------------------------------------
Status ConvertCrashDump(std::string_view raw, std::string* pprof_gz, DumpSummary* summary) {
  auto bad = [](const std::string& why) { return InvalidArgumentError("not a valid spyglass memory dump: " + why); };
  DumpHeader h{};
  if (raw.size() < sizeof h) return bad("shorter than its header");
  std::memcpy(&h, raw.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != 1) return bad("wrong magic or version");
  if (h.reason != 1 && h.reason != 2) return bad("unknown reason");
  struct Class {
    std::string device, kind;
  };
  std::unordered_map<uint32_t, Class> classes;
  std::unordered_map<uint32_t, std::vector<uintptr_t>> site_frames;
  std::unordered_map<uint32_t, uint32_t> site_class;
  std::unordered_map<uint32_t, std::pair<std::string, std::string>> functions;
  std::vector<uintptr_t> failed;
  std::vector<LiveEntry> live;
  std::string maps;
  size_t pos = sizeof h;
  bool ended = false;
  while (!ended) {
    uint32_t tag = 0, len = 0;
    if (raw.size() - pos < 8) return bad("truncated (no end record)");
    std::memcpy(&tag, raw.data() + pos, 4);
    std::memcpy(&len, raw.data() + pos + 4, 4);
    pos += 8;
    if (len > kMaxRecord || raw.size() - pos < len) return bad("a record runs past the end");
    const char* p = raw.data() + pos;
    pos += len;
    switch (tag) {
      case kClass: {
        if (len < 6) return bad("short class record");
        uint32_t id;
        std::memcpy(&id, p, 4);
        uint8_t dl = static_cast<uint8_t>(p[4]), kl = static_cast<uint8_t>(p[5]);
        if (len != 6u + dl + kl) return bad("class record length");
        classes[id] = {std::string(p + 6, dl), std::string(p + 6 + dl, kl)};
        break;
      }
      case kFailedFrames:
        if (len % 8 || len / 8 > kMaxFrames) return bad("failed-allocation stack length");
        failed.resize(len / 8);
        std::memcpy(failed.data(), p, len);
        break;
      case kLive: {
        if (len % sizeof(LiveEntry)) return bad("live record length");
        size_t n = len / sizeof(LiveEntry), at = live.size();
        live.resize(at + n);
        std::memcpy(live.data() + at, p, len);
        break;
      }
      case kSite: {
        uint32_t head[4];
        if (len < sizeof head) return bad("short stack record");
        std::memcpy(head, p, sizeof head);
        if (head[2] > kMaxFrames || len != sizeof head + head[2] * 8u) return bad("stack record length");
        std::vector<uintptr_t>& f = site_frames[head[0]];
        f.resize(head[2]);
        std::memcpy(f.data(), p + sizeof head, head[2] * 8u);
        site_class[head[0]] = head[1];
        break;
      }
      case kFunction: {
        uint32_t head[3];
        if (len < sizeof head) return bad("short function record");
        std::memcpy(head, p, sizeof head);
        if (uint64_t{head[1]} + head[2] + sizeof head != len) return bad("function record length");
        functions[head[0]] = {std::string(p + sizeof head, head[1]), std::string(p + sizeof head + head[1], head[2])};
        break;
      }
      case kMaps:
        if (maps.size() + len > (64u << 20)) return bad("maps over 64 MiB");
        maps.append(p, len);
        break;
      case kEnd: ended = true; break;
      default: return bad("unknown record " + std::to_string(tag));
    }
  }

  // Per stack: count and bytes, weighted as the snapshot weighs samples.
  struct Agg {
    double count = 0, bytes = 0;
  };
  std::unordered_map<uint32_t, Agg> by_site;
  const double interval = static_cast<double>(h.sample_interval);
  auto class_of = [&](uint32_t site) -> uint32_t {
    auto it = site_class.find(site);
    return it != site_class.end() ? it->second : site;  // ids below the first site are classes
  };
  int64_t live_bytes = 0;
  for (const LiveEntry& e : live) {
    Agg& a = by_site[e.site];
    double w = 1;
    auto c = classes.find(class_of(e.site));
    if (interval > 0 && c != classes.end() && c->second.kind == "heap") {
      double size = static_cast<double>(e.size ? e.size : 1);
      w = 1.0 / (1.0 - std::exp(-size / interval));
    }
    a.count += w;
    a.bytes += w * static_cast<double>(e.size);
  }

  ProfileData data;
  std::vector<uintptr_t> pcs;
  std::unordered_map<uintptr_t, uint64_t> loc_of;
  auto want = [&](const std::vector<uintptr_t>& frames) {
    for (uintptr_t w : frames)
      if (!IsSymbolicFrame(w) && loc_of.emplace(w, 0).second) pcs.push_back(w);
  };
  for (const auto& [site, agg] : by_site)
    if (auto it = site_frames.find(site); it != site_frames.end()) want(it->second);
  want(failed);
  auto syms = SymbolizeWithMaps(pcs, maps);
  LocationTable table(&data);
  for (uintptr_t pc : pcs) loc_of[pc] = table.Native(syms[pc]);
  auto location = [&](uintptr_t w) -> uint64_t {
    if (!IsSymbolicFrame(w)) return loc_of[w];
    auto [it, inserted] = loc_of.emplace(w, 0);
    if (inserted) {
      auto f = functions.find(SymbolicFunction(w));
      std::string name = f != functions.end() ? f->second.first : "<unknown>";
      std::string file = f != functions.end() ? f->second.second : "";
      it->second = table.Symbolic(table.Function(name, name, file, 0), SymbolicLine(w));
    }
    return it->second;
  };
  int64_t live_count = 0;
  for (const auto& [site, agg] : by_site) {
    ProfileSample s;
    if (auto it = site_frames.find(site); it != site_frames.end())
      for (uintptr_t w : it->second) s.location_ids.push_back(location(w));
    s.count = std::llround(agg.count);
    s.bytes = std::llround(agg.bytes);
    live_count += s.count;
    live_bytes += s.bytes;
    auto c = classes.find(class_of(site));
    s.kind = c != classes.end() ? c->second.kind : "unknown";
    if (s.kind != "executable") s.device = c != classes.end() ? c->second.device : "unknown";
    data.samples.push_back(std::move(s));
  }
  std::string failed_site;
  if (h.reason == 1) {
    ProfileSample s;
    for (uintptr_t w : failed) s.location_ids.push_back(location(w));
    s.count = 1;
    s.bytes = 0;  // never allocated: not live
    s.kind = "failed";
    s.device = "cpu:0";
    // The innermost interpreter frame (a Python function: the program's own
    // code), else the innermost native frame that is not the hook itself.
    for (uintptr_t w : failed) {
      if (!IsSymbolicFrame(w)) continue;
      auto f = functions.find(SymbolicFunction(w));
      if (f == functions.end()) continue;
      failed_site = f->second.first + " (" + f->second.second + ":" + std::to_string(SymbolicLine(w)) + ")";
      break;
    }
    for (uintptr_t w : failed) {
      if (IsSymbolicFrame(w) || !failed_site.empty()) continue;
      const SymLocation& sl = syms[w];
      if (!sl.frames.empty() && sl.frames.back().function.find("NewOrThrow") == std::string::npos) {
        failed_site = sl.frames.front().function;
        if (!sl.frames.front().file.empty())
          failed_site += " (" + sl.frames.front().file + ":" + std::to_string(sl.frames.front().line) + ")";
        break;
      }
    }
    data.samples.push_back(std::move(s));
    data.comments.push_back("spyglass: out of memory: an allocation of " + std::to_string(h.failed_bytes) +
                            " bytes failed" + (failed_site.empty() ? "" : " in " + failed_site) +
                            " (the sample of kind 'failed' has its stack)");
  } else {
    data.comments.push_back("spyglass: fatal signal " + std::to_string(h.signal) + " (" +
                            (sigabbrev_np(h.signal) ? std::string("SIG") + sigabbrev_np(h.signal) : "?") + ")");
  }
  if (h.skipped_shards)
    data.comments.push_back("spyglass: " + std::to_string(h.skipped_shards) +
                            " of 256 table shards were busy (held by a dying thread) and are missing");
  if (interval > 0) data.comments.push_back("spyglass: heap sampled every " + std::to_string(h.sample_interval) + " bytes");
  data.time_nanos = h.time_nanos;
  *pprof_gz = EncodePprofGz(data);
  if (summary) {
    summary->pid = h.pid;
    h.comm[sizeof h.comm - 1] = '\0';
    summary->comm = h.comm;
    while (!summary->comm.empty() && summary->comm.back() == '\n') summary->comm.pop_back();
    summary->reason = static_cast<DumpReason>(h.reason);
    summary->signal = h.signal;
    summary->failed_bytes = h.failed_bytes;
    summary->failed_site = failed_site;
    summary->live_bytes = live_bytes;
    summary->live_count = live_count;
    summary->skipped_shards = h.skipped_shards;
  }
  return Status::Ok();
}

}  // namespace spyglass::memory::internal
