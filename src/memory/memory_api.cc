// The public memory API (include/spyglass/memory.h) and the snapshot to pprof.
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "export/output_file.h"
#include "memory/pprof.h"
#include "memory/symbolize.h"
#include "memory/tracker.h"
#include "memory/unwind.h"
#include "spyglass/memory.h"

namespace spyglass::memory {

using namespace internal;  // NOLINT

// Frames captured per allocation (more are cut).
constexpr int kApiFrames = 64;

void record_allocation(const void* ptr, size_t bytes, std::string_view device, std::string_view kind) {
  if (ptr == nullptr || !g_api_enabled.load(std::memory_order_relaxed)) return;
  if (!Guard::Enter()) {
    if (Guard::InsideTracking()) Count(kReentrant);
    return;
  }
  uintptr_t frames[kMaxFrames];
  int n = SPYGLASS_CAPTURE_STACK(frames, kApiFrames);
  Record(reinterpret_cast<uintptr_t>(ptr), bytes, InternClass(device, kind), frames, n);
  Guard::Leave();
}

void record_allocation_with_frames(const void* ptr, size_t bytes, std::string_view device, std::string_view kind,
                                   std::span<const Frame> frames) {
  if (ptr == nullptr || !g_api_enabled.load(std::memory_order_relaxed)) return;
  if (!Guard::Enter()) {
    if (Guard::InsideTracking()) Count(kReentrant);
    return;
  }
  uintptr_t words[kApiFrames];
  int n = 0;
  for (const Frame& f : frames) {
    if (n == kApiFrames) break;
    words[n++] = SymbolicFrame(InternFunction(f.function, f.file), f.line);
  }
  Record(reinterpret_cast<uintptr_t>(ptr), bytes, InternClass(device, kind), words, n);
  Guard::Leave();
}

void record_free(const void* ptr) {
  if (ptr == nullptr) return;
  if (!Guard::Enter()) {
    if (Guard::InsideTracking()) Count(kReentrant);
    return;
  }
  Remove(reinterpret_cast<uintptr_t>(ptr));
  Guard::Leave();
}

void set_tracking_enabled(bool enabled) { g_api_enabled.store(enabled); }
bool tracking_enabled() { return g_api_enabled.load(); }

TrackingStats tracking_stats() {
  ScopedUntracked untracked;
  SettleFrees();
  TrackingStats s;
  s.allocations = CounterValue(kAllocations);
  s.frees = CounterValue(kFrees);
  s.unknown_frees = CounterValue(kUnknownFrees);
  s.double_frees = CounterValue(kDoubleFrees);
  s.replaced = CounterValue(kReplaced);
  s.reentrant_skipped = CounterValue(kReentrant);
  s.dropped_table_full = CounterValue(kDroppedTable);
  s.dropped_stacks = CounterValue(kDroppedStacks);
  s.counter_events_dropped = CounterValue(kCounterDropped);
  s.live_allocations = LiveCount();
  int64_t bytes = 0;
  for (int64_t b : LiveBytesByClass()) bytes += b;
  s.live_bytes = static_cast<uint64_t>(bytes);
  s.distinct_stacks = SiteCount();
  s.table_bytes = TableBytes();
  s.stack_bytes = SiteBytes();
  s.sample_interval_bytes = SampleInterval();
  s.distinct_functions = FunctionCount();
  s.dropped_functions = CounterValue(kDroppedFunctions);
  return s;
}

namespace {

bool DeviceMatches(std::string_view device, std::string_view backend) {
  if (backend.empty() || device == backend) return true;
  // "gpu" selects "gpu:0", "gpu:1", ...
  return device.size() > backend.size() && device.substr(0, backend.size()) == backend && device[backend.size()] == ':';
}

struct Agg {
  double count = 0, bytes = 0;
};

// Which classes `backend` selects ("" = all, "gpu" = every "gpu:N", "gpu:1").
std::vector<char> MatchingClasses(std::string_view backend) {
  std::vector<char> match(kMaxClasses + 1, 0);
  for (uint32_t c = 1; c <= ClassCount(); ++c) match[c] = DeviceMatches(ClassDevice(c), backend);
  return match;
}

// "spyglass: peak <device> <bytes> bytes" for each selected device that has
// had memory: every profile says how high each device went.
std::vector<std::string> PeakComments(std::string_view backend) {
  std::vector<std::string> out;
  for (uint32_t d = 0; d < DeviceCount(); ++d) {
    std::string_view name = DeviceName(d);
    DeviceTotals t = GetDeviceTotals(d);
    if (!DeviceMatches(name, backend) || t.peak_bytes <= 0) continue;
    out.push_back("spyglass: peak " + std::string(name) + " " + std::to_string(t.peak_bytes) + " bytes");
  }
  return out;
}

// Symbolizes the sites of `by_site` and writes the gzipped pprof.
std::string EncodeSites(const std::unordered_map<uint32_t, Agg>& by_site, std::vector<std::string> comments);

}  // namespace

Status SnapshotPprof(std::string_view backend, std::string* out, std::vector<std::string> comments) {
  ScopedUntracked untracked;
  SettleFrees();
  const uint32_t nclasses = ClassCount();
  std::vector<char> match = MatchingClasses(backend), sampled(kMaxClasses + 1, 0);
  const double interval = static_cast<double>(SampleInterval());
  for (uint32_t c = 1; c <= nclasses; ++c) sampled[c] = interval > 0 && ClassKind(c) == "heap";
  std::unordered_map<uint32_t, Agg> by_site;
  ForEachLive([&](const LiveRecord& r) {
    uint32_t cls = SiteClass(r.site);
    if (!match[cls]) return;
    Agg& a = by_site[r.site];
    double w = 1;
    if (sampled[cls]) {
      // Unbiased estimate of a Poisson-sampled allocation (as tcmalloc's heap profiles).
      double size = static_cast<double>(r.size ? r.size : 1);
      w = 1.0 / (1.0 - std::exp(-size / interval));
    }
    a.count += w;
    a.bytes += w * static_cast<double>(r.size);
  });
  for (std::string& c : PeakComments(backend)) comments.push_back(std::move(c));
  *out = EncodeSites(by_site, std::move(comments));
  return Status::Ok();
}

Status PeakPprof(std::string_view backend, std::string* out) {
  ScopedUntracked untracked;
  SettleFrees();  // the peak comments' and sites' values are exact; the counters noted too
  std::vector<char> match = MatchingClasses(backend);
  std::unordered_map<uint32_t, Agg> by_site;
  auto add = [&](uint32_t id) {
    if (!match[SiteClass(id)]) return;
    SiteValue v = SiteAtPeak(id);
    if (v.count <= 0 && v.bytes <= 0) return;
    by_site[id] = {static_cast<double>(v.count) / static_cast<double>(kCountUnit), static_cast<double>(v.bytes)};
  };
  for (uint32_t c = 1; c <= ClassCount(); ++c) add(c);
  for (uint32_t id = FirstSiteId(), end = EndSiteId(); id < end; ++id) add(id);
  std::vector<std::string> comments = {"spyglass: the live set at the high-water mark of live bytes, per device"};
  for (std::string& c : PeakComments(backend)) comments.push_back(std::move(c));
  *out = EncodeSites(by_site, std::move(comments));
  return Status::Ok();
}

namespace {

std::string EncodeSites(const std::unordered_map<uint32_t, Agg>& by_site, std::vector<std::string> comments) {
  const double interval = static_cast<double>(SampleInterval());
  // Distinct stack words: return addresses are symbolized once each;
  // symbolic frames (explicit stacks) become a location of their function.
  std::unordered_map<uintptr_t, uint64_t> loc_of_pc;
  std::vector<uintptr_t> pcs, symbolic;
  for (const auto& [site, agg] : by_site)
    if (const Site* s = GetSite(site))
      for (uint32_t i = 0; i < s->depth; ++i)
        if (loc_of_pc.emplace(s->frames[i], 0).second)
          (IsSymbolicFrame(s->frames[i]) ? symbolic : pcs).push_back(s->frames[i]);
  auto syms = Symbolize(pcs);

  ProfileData data;
  LocationTable table(&data);
  for (uintptr_t pc : pcs) loc_of_pc[pc] = table.Native(syms[pc]);
  // As JAX's Python frames: no address, one line; name = system_name.
  std::unordered_map<uint32_t, uint64_t> fn_of_symbolic;
  for (uintptr_t w : symbolic) {
    uint32_t id = SymbolicFunction(w);
    auto [it, inserted] = fn_of_symbolic.emplace(id, 0);
    if (inserted) {
      std::string_view name, file;
      if (!FunctionNames(id, &name, &file)) name = "<unknown>";
      std::string n(name);
      it->second = table.Function(n, n, std::string(file), 0);
    }
    loc_of_pc[w] = table.Symbolic(it->second, SymbolicLine(w));
  }
  for (const auto& [site, agg] : by_site) {
    ProfileSample s;
    if (const Site* st = GetSite(site))
      for (uint32_t i = 0; i < st->depth; ++i) s.location_ids.push_back(loc_of_pc[st->frames[i]]);
    uint32_t cls = SiteClass(site);
    s.count = std::llround(agg.count);
    s.bytes = std::llround(agg.bytes);
    s.kind = std::string(ClassKind(cls));
    // As JAX: executables carry no device label.
    if (s.kind != "executable") s.device = std::string(ClassDevice(cls));
    data.samples.push_back(std::move(s));
  }
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  data.time_nanos = int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
  data.comments = std::move(comments);
  auto note = [&](const char* what, Counter c) {
    if (uint64_t v = CounterValue(c)) data.comments.push_back(std::string("spyglass: ") + what + "=" + std::to_string(v));
  };
  note("unknown_frees", kUnknownFrees);
  note("double_frees", kDoubleFrees);
  note("dropped_table_full", kDroppedTable);
  note("dropped_stacks", kDroppedStacks);
  note("stacks_cut", kCutStacks);  // ended at a frame the unwinder could not unwind
  note("reentrant_skipped", kReentrant);
  note("dropped_functions", kDroppedFunctions);
  if (interval > 0) data.comments.push_back("spyglass: heap sampled every " + std::to_string(SampleInterval()) + " bytes");
  return EncodePprofGz(data);
}

}  // namespace

Status peak_memory_profile(std::string* out, std::string_view backend) {
  if (out == nullptr) return InvalidArgumentError("peak_memory_profile: out is null");
  return PeakPprof(backend, out);
}

Status save_peak_profile(const std::string& path, std::string_view backend) {
  ScopedUntracked untracked;
  std::string bytes;
  if (Status s = PeakPprof(backend, &bytes); !s.ok()) return s;
  return exporter::WriteOutputBytes(path, bytes);
}

std::vector<DeviceMemory> device_memory() {
  ScopedUntracked untracked;
  SettleFrees();
  std::vector<DeviceMemory> out;
  for (uint32_t d = 0; d < DeviceCount(); ++d) {
    DeviceTotals t = GetDeviceTotals(d);
    out.push_back({std::string(DeviceName(d)), t.live_bytes, t.peak_bytes});
  }
  return out;
}

}  // namespace spyglass::memory

namespace spyglass::profiler {

Status device_memory_profile(std::string* out, std::string_view backend) {
  if (out == nullptr) return InvalidArgumentError("device_memory_profile: out is null");
  return memory::SnapshotPprof(backend, out);
}

Status save_device_memory_profile(const std::string& path, std::string_view backend) {
  memory::internal::ScopedUntracked untracked;
  std::string bytes;
  if (Status s = device_memory_profile(&bytes, backend); !s.ok()) return s;
  return exporter::WriteOutputBytes(path, bytes);
}

}  // namespace spyglass::profiler
