// Live bytes over time (timeline.h) and the profile file names.
#include "memory/timeline.h"

#include <sched.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "common/quote.h"
#include "export/output_file.h"
#include "memory/call_site.h"
#include "memory/symbolize.h"

namespace spyglass::memory {

using namespace internal;  // NOLINT

namespace {

struct RawPoint {
  int64_t t;
  int64_t live[kTimelineDevices];
  int64_t max[kTimelineDevices];
  uint32_t site[kTimelineTopSites];
  int64_t site_bytes[kTimelineTopSites];
};

// Written only by the holder of g_busy (a try-lock: a thread that finds it
// taken skips its point; a reader waits for it).
std::atomic<bool> g_busy{false};
std::atomic<RawPoint*> g_points{nullptr};
int g_n = 0;
int64_t g_interval_ns = kTimelineFirstIntervalNs;
int64_t g_start_ns = 0;
std::atomic<int64_t> g_next_ns{0};

int64_t MonoNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void Lock() {
  for (int spins = 0; g_busy.exchange(true, std::memory_order_acquire); ++spins)
    if (spins > 64) sched_yield();
}
void Unlock() { g_busy.store(false, std::memory_order_release); }

// Caller holds g_busy. mmap'd, never malloc'd: points are taken inside malloc.
void TakePointLocked(int64_t now) {
  RawPoint* pts = g_points.load(std::memory_order_relaxed);
  if (!pts) {
    void* m = mmap(nullptr, sizeof(RawPoint) * kTimelinePoints, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED) return;
    pts = static_cast<RawPoint*>(m);
    g_points.store(pts, std::memory_order_release);
  }
  if (g_n == 0) g_start_ns = now;
  if (g_n == kTimelinePoints) {
    // Full: merge neighbours (the later live value, the higher maximum) and double the interval.
    for (int i = 0; i < kTimelinePoints / 2; ++i) {
      RawPoint a = pts[2 * i], b = pts[2 * i + 1];
      for (int d = 0; d < kTimelineDevices; ++d) b.max[d] = std::max(a.max[d], b.max[d]);
      pts[i] = b;
    }
    g_n = kTimelinePoints / 2;
    g_interval_ns *= 2;
  }
  RawPoint& p = pts[g_n];
  std::memset(&p, 0, sizeof p);
  p.t = now - g_start_ns;
  const uint32_t ndev = std::min<uint32_t>(DeviceCount(), kTimelineDevices);
  for (uint32_t d = 0; d < ndev; ++d) {
    p.live[d] = GetDeviceTotals(d).live_bytes;
    p.max[d] = std::max(TakeWindowMax(d), p.live[d]);
  }
  // The top sites by live bytes now (classes without stacks included).
  int n = 0;
  auto consider = [&](uint32_t id) {
    int64_t b = SiteNow(id).bytes;
    if (b <= 0 || (n == kTimelineTopSites && b <= p.site_bytes[n - 1])) return;
    int i = n < kTimelineTopSites ? n++ : n - 1;
    while (i > 0 && p.site_bytes[i - 1] < b) {
      p.site[i] = p.site[i - 1];
      p.site_bytes[i] = p.site_bytes[i - 1];
      --i;
    }
    p.site[i] = id;
    p.site_bytes[i] = b;
  };
  for (uint32_t c = 1; c <= ClassCount(); ++c) consider(c);
  for (uint32_t id = FirstSiteId(), end = EndSiteId(); id < end; ++id) consider(id);
  ++g_n;
  const int64_t scan_ns = MonoNs() - now;
  g_next_ns.store(now + std::max(g_interval_ns, 50 * scan_ns), std::memory_order_relaxed);
}

std::string Clean(std::string s) {
  for (char& c : s)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return s;
}

// The site's stack by name, from its call site on (the allocator's plumbing
// and a program's wrappers left out, as the reports name sites): at most 6.
std::string StackName(uint32_t id, const std::unordered_map<uintptr_t, SymLocation>& syms) {
  const Site* s = GetSite(id);
  if (!s) return "";
  std::vector<std::string> all;
  for (uint32_t i = 0; i < s->depth && all.size() < 64; ++i) {
    uintptr_t w = s->frames[i];
    std::vector<std::string> fs;
    if (IsSymbolicFrame(w)) {
      std::string_view fn, file;
      fs.push_back(FunctionNames(SymbolicFunction(w), &fn, &file) ? std::string(fn) : "<unknown>");
    } else if (auto it = syms.find(w); it != syms.end() && !it->second.frames.empty()) {
      for (const SymFrame& f : it->second.frames) fs.push_back(f.function);
    } else {
      char hex[32];
      std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(w));
      fs.push_back(hex);
    }
    for (std::string& f : fs) all.push_back(std::move(f));
  }
  size_t first = 0;
  while (first + 1 < all.size() && (IsPlumbing(all[first]) || IsAllocatorWrapper(all[first]))) ++first;
  std::string out;
  for (size_t i = first; i < all.size() && i < first + 6; ++i) {
    if (!out.empty()) out += " <- ";
    out += all[i];
  }
  return Clean(out);
}

bool ParseInt(std::string_view s, int64_t* v) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size();
}

std::vector<std::string_view> SplitTabs(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start));
    if (tab == std::string_view::npos) break;
    start = tab + 1;
  }
  return out;
}

}  // namespace

void internal::TimelineTick() {
  const int64_t now = MonoNs();
  if (now < g_next_ns.load(std::memory_order_relaxed)) return;
  if (g_busy.exchange(true, std::memory_order_acquire)) return;  // another thread is taking this point
  TakePointLocked(now);
  Unlock();
}

void TimelineSampleNow() {
  SettleFrees();
  Lock();
  TakePointLocked(MonoNs());
  Unlock();
}

void TimelineReset() {
  // A forked child: the lock may have been held by a thread that is gone.
  g_busy.store(false, std::memory_order_relaxed);
  g_n = 0;
  g_interval_ns = kTimelineFirstIntervalNs;
  g_next_ns.store(0, std::memory_order_relaxed);
}

Timeline CurrentTimeline(bool symbolize) {
  ScopedUntracked untracked;
  std::vector<RawPoint> raw;
  Timeline t;
  Lock();
  if (RawPoint* pts = g_points.load(std::memory_order_acquire)) raw.assign(pts, pts + g_n);
  t.start_monotonic_ns = g_start_ns;
  t.interval_ns = g_interval_ns;
  Unlock();
  const uint32_t ndev = std::min<uint32_t>(DeviceCount(), kTimelineDevices);
  for (uint32_t d = 0; d < ndev; ++d) {
    t.devices.emplace_back(Clean(std::string(DeviceName(d))));
    t.peak_bytes.push_back(GetDeviceTotals(d).peak_bytes);
  }
  std::map<uint32_t, bool> ids;
  for (const RawPoint& r : raw) {
    TimelinePoint p;
    p.t_ns = r.t;
    p.live.assign(r.live, r.live + ndev);
    p.max.assign(r.max, r.max + ndev);
    for (int i = 0; i < kTimelineTopSites && r.site[i]; ++i) {
      p.sites.emplace_back(r.site[i], r.site_bytes[i]);
      ids[r.site[i]] = true;
    }
    t.points.push_back(std::move(p));
  }
  std::unordered_map<uintptr_t, SymLocation> syms;
  if (symbolize) {
    std::vector<uintptr_t> pcs;
    for (const auto& [id, _] : ids)
      if (const Site* s = GetSite(id))
        for (uint32_t i = 0; i < s->depth && i < 16; ++i)
          if (!IsSymbolicFrame(s->frames[i])) pcs.push_back(s->frames[i]);
    syms = Symbolize(pcs);
  }
  for (const auto& [id, _] : ids) {
    TimelineSite s;
    s.id = id;
    s.device = Clean(std::string(DeviceName(ClassDeviceIndex(SiteClass(id)))));
    s.stack = StackName(id, syms);
    t.sites.push_back(std::move(s));
  }
  return t;
}

std::string FormatTimeline(const Timeline& t) {
  std::ostringstream o;
  o << "# spyglass memory timeline 1\n";
  o << "# start_monotonic_ns\t" << t.start_monotonic_ns << "\n";
  o << "# interval_ns\t" << t.interval_ns << "\n";
  for (size_t d = 0; d < t.devices.size(); ++d)
    o << "# device\t" << Clean(t.devices[d]) << "\t" << (d < t.peak_bytes.size() ? t.peak_bytes[d] : 0) << "\n";
  for (const TimelineSite& s : t.sites) o << "# site\t" << s.id << "\t" << Clean(s.device) << "\t" << Clean(s.stack) << "\n";
  o << "t_ns";
  for (const std::string& d : t.devices) o << "\t" << Clean(d) << " live\t" << Clean(d) << " max";
  for (const TimelineSite& s : t.sites) o << "\tsite " << s.id;
  o << "\n";
  for (const TimelinePoint& p : t.points) {
    o << p.t_ns;
    for (size_t d = 0; d < t.devices.size(); ++d)
      o << "\t" << (d < p.live.size() ? p.live[d] : 0) << "\t" << (d < p.max.size() ? p.max[d] : 0);
    for (const TimelineSite& s : t.sites) {
      o << "\t";
      for (const auto& [id, bytes] : p.sites)
        if (id == s.id) o << bytes;
    }
    o << "\n";
  }
  return o.str();
}

Status ParseTimeline(std::string_view text, Timeline* out) {
  if (out == nullptr) return InvalidArgumentError("ParseTimeline: out is null");
  if (text.size() > kMaxTimelineBytes)
    return InvalidArgumentError("memory timeline: " + std::to_string(text.size()) + " bytes, over the limit of " +
                                std::to_string(kMaxTimelineBytes));
  Timeline t;
  constexpr std::string_view kMagic = "# spyglass memory timeline 1";
  if (text.substr(0, kMagic.size()) != kMagic)
    return InvalidArgumentError("not a spyglass memory timeline (first line " +
                                QuoteInput(text.substr(0, text.find('\n'))) + ")");
  bool header = false;
  size_t columns = 0, lineno = 0;
  std::vector<uint32_t> site_cols;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++lineno;
    if (line.empty()) continue;
    auto bad = [&](const char* why) {
      return InvalidArgumentError("memory timeline line " + std::to_string(lineno) + ": " + why + ": " +
                                  QuoteInput(line));
    };
    std::vector<std::string_view> f = SplitTabs(line);
    int64_t v = 0;
    if (line[0] == '#') {
      if (header) return bad("metadata after the header");
      if (f[0] == "# start_monotonic_ns" && f.size() == 2 && ParseInt(f[1], &v)) {
        t.start_monotonic_ns = v;
      } else if (f[0] == "# interval_ns" && f.size() == 2 && ParseInt(f[1], &v)) {
        t.interval_ns = v;
      } else if (f[0] == "# device" && f.size() == 3 && ParseInt(f[2], &v)) {
        t.devices.emplace_back(f[1]);
        t.peak_bytes.push_back(v);
      } else if (f[0] == "# site" && f.size() == 4 && ParseInt(f[1], &v) && v > 0 && v <= UINT32_MAX) {
        t.sites.push_back({static_cast<uint32_t>(v), std::string(f[2]), std::string(f[3])});
      } else if (lineno != 1) {
        return bad("unknown metadata");
      }
      continue;
    }
    if (!header) {
      columns = 1 + 2 * t.devices.size() + t.sites.size();
      if (f.size() != columns || f[0] != "t_ns") return bad("the header does not match the devices and sites");
      for (size_t d = 0; d < t.devices.size(); ++d)
        if (f[1 + 2 * d] != t.devices[d] + " live" || f[2 + 2 * d] != t.devices[d] + " max")
          return bad("the header does not match the devices");
      for (size_t i = 0; i < t.sites.size(); ++i) {
        if (f[1 + 2 * t.devices.size() + i] != "site " + std::to_string(t.sites[i].id))
          return bad("the header does not match the sites");
        site_cols.push_back(t.sites[i].id);
      }
      header = true;
      continue;
    }
    if (f.size() != columns) return bad("wrong number of columns");
    if (t.points.size() >= 1000000) return bad("more than 1000000 points");
    TimelinePoint p;
    if (!ParseInt(f[0], &p.t_ns)) return bad("t_ns is not an integer");
    for (size_t d = 0; d < t.devices.size(); ++d) {
      int64_t live = 0, max = 0;
      if (!ParseInt(f[1 + 2 * d], &live) || !ParseInt(f[2 + 2 * d], &max)) return bad("a device column is not an integer");
      p.live.push_back(live);
      p.max.push_back(max);
    }
    for (size_t i = 0; i < site_cols.size(); ++i) {
      std::string_view c = f[1 + 2 * t.devices.size() + i];
      if (c.empty()) continue;
      if (!ParseInt(c, &v)) return bad("a site column is not an integer");
      p.sites.emplace_back(site_cols[i], v);
    }
    t.points.push_back(std::move(p));
  }
  if (!header) return InvalidArgumentError("memory timeline: no header line (truncated?)");
  *out = std::move(t);
  return Status::Ok();
}

Status ReadTimelineFile(const std::string& path, Timeline* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot open memory timeline " + QuoteInput(path));
  // Read in chunks up to one byte over the limit (ParseTimeline refuses it).
  std::string text;
  char buf[1 << 16];
  while (text.size() <= kMaxTimelineBytes && in.read(buf, sizeof buf).gcount() > 0)
    text.append(buf, static_cast<size_t>(in.gcount()));
  return ParseTimeline(text, out);
}

Status SaveTimeline(const std::string& path) {
  ScopedUntracked untracked;
  TimelineSampleNow();
  return exporter::WriteOutputBytes(path, FormatTimeline(CurrentTimeline(true)));
}

std::string SafeComm(std::string_view comm) {
  std::string out;
  for (char c : comm.substr(0, 64)) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-' || c == '+';
    out += ok ? c : '_';
  }
  if (out.empty() || out == "." || out == "..") out = "unknown";
  return out;
}

std::string SelfComm() {
  char buf[64] = {};
  std::string comm;
  if (FILE* f = std::fopen("/proc/self/comm", "re")) {
    if (std::fgets(buf, sizeof buf, f)) comm = buf;
    std::fclose(f);
  }
  while (!comm.empty() && (comm.back() == '\n' || comm.back() == '\r')) comm.pop_back();
  return SafeComm(comm);
}

std::string MemoryProfileName(long pid, std::string_view comm, std::string_view tag) {
  return "memory." + std::to_string(pid) + "." + SafeComm(comm) + "." + std::string(tag) + ".prof";
}

std::string MemoryTimelineName(long pid, std::string_view comm) {
  return "memory." + std::to_string(pid) + "." + SafeComm(comm) + ".timeline.tsv";
}

}  // namespace spyglass::memory
