// The tracking core through the explicit API (also run under TSan and ASan):
// snapshots as pprof, labels, backends, bad input, threads, fork, signals,
// thread exit, the trace counter track, the pprof reader and the reports.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "memory/pprof.h"
#include "memory/tracker.h"
#include "memory/unwind.h"
#include "spyglass/memory.h"
#include "spyglass/profiler.h"
#include "test_util.h"

namespace mem = spyglass::memory;
namespace prof = spyglass::profiler;
using spyglass::testing::MakeTempDir;
using spyglass::testing::ReadGzip;

namespace {

// Fake addresses (never dereferenced), distinct per test.
uintptr_t Addr(uintptr_t base, uintptr_t i) { return (base << 32) + i * 64; }
const void* P(uintptr_t base, uintptr_t i) { return reinterpret_cast<const void*>(Addr(base, i)); }

__attribute__((noinline)) void AllocateModelWeights(uintptr_t base, int n) {
  for (int i = 0; i < n; ++i) mem::record_allocation(P(base, i), 1000, "gpu:0", "buffer");
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void CompileProgram(uintptr_t base) {
  mem::record_allocation(P(base, 0), 4096, "cpu:0", "executable");
  asm volatile("" ::: "memory");
}

mem::PprofProfile Snapshot(std::string_view backend = "") {
  std::string bytes;
  EXPECT_TRUE(prof::device_memory_profile(&bytes, backend).ok());
  mem::PprofProfile p;
  spyglass::Status s = mem::ParsePprof(bytes, &p);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return p;
}

bool HasFunction(const mem::PprofSample& s, const std::string& name) {
  for (const auto& f : s.frames)
    if (f.function.find(name) != std::string::npos) return true;
  return false;
}

// Sums (count, bytes) of samples with a frame named `fn` and the labels given.
std::pair<int64_t, int64_t> Sum(const mem::PprofProfile& p, const std::string& fn, const std::string& device = "",
                                const std::string& kind = "") {
  int64_t c = 0, b = 0;
  for (const auto& s : p.samples) {
    if (!fn.empty() && !HasFunction(s, fn)) continue;
    if (!device.empty() && (s.labels.count("device") == 0 || s.labels.at("device") != device)) continue;
    if (!kind.empty() && s.labels.at("kind") != kind) continue;
    c += s.values[0];
    b += s.values[1];
  }
  return {c, b};
}

void FreeAll(uintptr_t base, int n) {
  for (int i = 0; i < n; ++i) mem::record_free(P(base, i));
}

}  // namespace

TEST(MemoryProfile, SnapshotHasJaxSampleTypesLabelsAndStacks) {
  AllocateModelWeights(1, 3);
  CompileProgram(2);
  mem::PprofProfile p = Snapshot();
  ASSERT_EQ(p.sample_types.size(), 2u);
  EXPECT_EQ(p.sample_types[0], (std::pair<std::string, std::string>{"allocations", "count"}));
  EXPECT_EQ(p.sample_types[1], (std::pair<std::string, std::string>{"space", "bytes"}));
  EXPECT_EQ(Sum(p, "AllocateModelWeights", "gpu:0", "buffer"), (std::pair<int64_t, int64_t>{3, 3000}));
  auto exe = Sum(p, "CompileProgram", "", "executable");
  EXPECT_EQ(exe, (std::pair<int64_t, int64_t>{1, 4096}));
  for (const auto& s : p.samples)
    if (s.labels.at("kind") == "executable") EXPECT_EQ(s.labels.count("device"), 0u);  // as JAX
  // The call site line of the caller is known (debug info) and the test body is on the stack.
  for (const auto& s : p.samples)
    if (HasFunction(s, "AllocateModelWeights")) {
      EXPECT_TRUE(HasFunction(s, "SnapshotHasJaxSampleTypesLabelsAndStacks")) << mem::CallSite(s);
      EXPECT_NE(mem::CallSite(s).find("memory_core_test.cc"), std::string::npos) << mem::CallSite(s);
    }
  FreeAll(1, 3);
  FreeAll(2, 1);
  EXPECT_EQ(Sum(Snapshot(), "AllocateModelWeights").first, 0);
}

TEST(MemoryProfile, BackendSelectsDevices) {
  mem::record_allocation(P(3, 0), 10, "gpu:0");
  mem::record_allocation(P(3, 1), 20, "gpu:1");
  mem::record_allocation(P(3, 2), 40, "cpu:0");
  auto devices = [](const mem::PprofProfile& p) {
    std::map<std::string, int64_t> out;
    for (const auto& s : p.samples)
      if (s.labels.count("device")) out[std::string(s.labels.at("device"))] += s.values[1];
    return out;
  };
  auto all = devices(Snapshot());
  EXPECT_GE(all["gpu:0"], 10);
  EXPECT_GE(all["cpu:0"], 40);
  auto gpu = devices(Snapshot("gpu"));
  EXPECT_EQ(gpu.count("cpu:0"), 0u);
  EXPECT_GE(gpu["gpu:1"], 20);
  auto one = devices(Snapshot("gpu:1"));
  EXPECT_EQ(one.size(), 1u);
  EXPECT_EQ(one["gpu:1"], 20);
  FreeAll(3, 3);
}

TEST(MemoryProfile, UnknownAndDoubleFreesAreCounted) {
  auto before = mem::tracking_stats();
  mem::record_free(P(4, 999));  // never recorded
  mem::record_allocation(P(4, 1), 8);
  mem::record_free(P(4, 1));
  mem::record_free(P(4, 1));  // again
  mem::record_free(nullptr);  // ignored
  auto after = mem::tracking_stats();
  EXPECT_EQ(after.unknown_frees - before.unknown_frees, 1u);
  EXPECT_EQ(after.double_frees - before.double_frees, 1u);
  EXPECT_EQ(after.frees - before.frees, 1u);
  // A pointer reused after its free is a new allocation, not a double free.
  mem::record_allocation(P(4, 1), 8);
  mem::record_free(P(4, 1));
  EXPECT_EQ(mem::tracking_stats().double_frees, after.double_frees);
}

TEST(MemoryProfile, TrackedAllocationIsRaii) {
  uint64_t live = mem::tracking_stats().live_allocations;
  {
    mem::TrackedAllocation a(P(5, 0), 100, "gpu:0", "buffer");
    mem::TrackedAllocation b = std::move(a);
    EXPECT_EQ(mem::tracking_stats().live_allocations, live + 1);
  }
  EXPECT_EQ(mem::tracking_stats().live_allocations, live);
}

TEST(MemoryProfile, ManyThreadsAllocateAtOnce) {
  auto before = mem::tracking_stats();
  constexpr int kThreads = 8, kOps = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < kOps; ++i) {
        mem::record_allocation(P(100 + t, i), 16 + i % 100, t % 2 ? "gpu:0" : "cpu:0");
        if (i >= 10) mem::record_free(P(100 + t, i - 10));
      }
    });
  for (auto& th : threads) th.join();
  auto after = mem::tracking_stats();
  EXPECT_EQ(after.live_allocations - before.live_allocations, uint64_t{kThreads} * 10);
  EXPECT_EQ(after.unknown_frees, before.unknown_frees);
  for (int t = 0; t < kThreads; ++t)
    for (int i = kOps - 10; i < kOps; ++i) mem::record_free(P(100 + t, i));
  EXPECT_EQ(mem::tracking_stats().live_allocations, before.live_allocations);
}

TEST(MemoryProfile, ForkedChildKeepsWorking) {
  mem::record_allocation(P(6, 0), 123, "gpu:0");
  // Threads hammering the tracker while forking: the child must not deadlock.
  std::atomic<bool> stop{false};
  std::thread hammer([&] {
    for (int i = 0; !stop; ++i) {
      mem::record_allocation(P(7, i % 1000), 8);
      mem::record_free(P(7, i % 1000));
    }
  });
  for (int k = 0; k < 5; ++k) {
    pid_t pid = fork();
    if (pid == 0) {
      mem::record_allocation(P(6, 1), 7, "gpu:0");
      std::string bytes;
      bool ok = prof::device_memory_profile(&bytes).ok() && !bytes.empty();
      mem::record_free(P(6, 1));
      _exit(ok ? 0 : 1);
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  stop = true;
  hammer.join();
  mem::record_free(P(6, 0));
}

namespace {
std::atomic<int> g_in_handler{0};
void Handler(int) {
  mem::record_allocation(P(8, 1 + g_in_handler.fetch_add(1)), 5, "cpu:0", "signal");
}
}  // namespace

TEST(MemoryProfile, AllocationFromSignalHandler) {
  struct sigaction sa {}, old{};
  sa.sa_handler = Handler;
  sigaction(SIGUSR1, &sa, &old);
  pthread_t main_thread = pthread_self();
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    while (!stop) {
      pthread_kill(main_thread, SIGUSR1);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(300); ++i) {
    mem::record_allocation(P(9, i % 512), 32);
    mem::record_free(P(9, i % 512));
  }
  stop = true;
  sender.join();
  sigaction(SIGUSR1, &old, nullptr);
  int n = g_in_handler.load();
  EXPECT_GT(n, 0);
  // Every handler call was either recorded or counted as reentrant: nothing lost silently, no deadlock.
  auto p = Snapshot();
  int64_t recorded = Sum(p, "", "", "signal").first;
  EXPECT_LE(recorded, n);
  EXPECT_EQ(recorded + static_cast<int64_t>(mem::tracking_stats().reentrant_skipped) >= n, true);
  for (int i = 1; i <= n; ++i) mem::record_free(P(8, i));
}

namespace {
struct ExitRecorder {
  ~ExitRecorder() {
    mem::record_allocation(P(10, 1), 1, "cpu:0", "at-exit");
    mem::record_free(P(10, 0));
    mem::record_free(P(10, 1));
  }
};
}  // namespace

TEST(MemoryProfile, RecordingDuringThreadExit) {
  auto before = mem::tracking_stats();
  std::thread([] {
    thread_local ExitRecorder r;
    mem::record_allocation(P(10, 0), 1, "cpu:0", "at-exit");
    (void)&r;
  }).join();
  auto after = mem::tracking_stats();
  EXPECT_EQ(after.frees - before.frees, 2u);
  EXPECT_EQ(after.live_allocations, before.live_allocations);
}

TEST(MemoryProfile, EveryUnwinderFindsTheCaller) {
  using mem::internal::Unwinder;
  for (Unwinder u : {Unwinder::kCfi, Unwinder::kFramePointer, Unwinder::kLibunwind, Unwinder::kGlibc}) {
    mem::internal::SetUnwinder(u);
    AllocateModelWeights(11, 1);
    auto p = Snapshot("gpu:0");
    EXPECT_EQ(Sum(p, "AllocateModelWeights").first, 1) << "unwinder " << int(u);
    FreeAll(11, 1);
  }
  mem::internal::SetUnwinder(Unwinder::kCfi);
}

// The cfi walk that replays the thread's previous walk from the frame where
// they meet gives the plain walk's stack, whatever the two stacks share: call
// sites, depths (past the frame limit too), frames of other sizes.
namespace cfi_trail {
using mem::internal::CfiTrail;
CfiTrail g_walks[2];
int g_latest = 0;
struct Walk {
  std::vector<uintptr_t> trail, plain;
  bool same;
  bool hash_ok;
};
std::vector<Walk> g_seen;

__attribute__((noinline)) void CaptureBoth() {
  Walk w;
  bool same = false;
  uint64_t hash = 0;
  CfiTrail& cur = g_walks[g_latest ^ 1];
  int d = mem::internal::CaptureCfiTrail(__builtin_frame_address(0), &cur, &g_walks[g_latest], 64, &same, &hash);
  g_latest ^= 1;
  w.trail.assign(cur.ra, cur.ra + d);
  uintptr_t buf[64];
  int d2 = mem::internal::CaptureCfi(__builtin_frame_address(0), buf, 64);
  w.plain.assign(buf, buf + d2);
  w.same = same;
  uint64_t h = mem::internal::kStackHashSeed;
  for (int i = 0; i < d2; ++i) h = mem::internal::StackHashStep(h, buf[i], i);
  w.hash_ok = h == hash;
  g_seen.push_back(std::move(w));
  asm volatile("" ::: "memory");
}
// Frames of two sizes, and two call sites of one function in another with
// the same frame size: walks meet at varying places and part again above.
__attribute__((noinline)) void Small(int depth, int site);
__attribute__((noinline)) void Big(int depth, int site) {
  volatile char pad[96];
  pad[0] = static_cast<char>(depth);
  if (depth == 0) {
    CaptureBoth();
  } else if (site % 3 == 0) {
    Small(depth - 1, site / 3 + depth);
  } else if (site % 3 == 1) {
    Big(depth - 1, site / 3 + depth);
    asm volatile("nop" ::: "memory");
  } else {
    Big(depth - 1, site / 3 + depth);
    asm volatile("nop; nop" ::: "memory");
  }
  asm volatile("" ::: "memory");
  (void)pad[0];
}
__attribute__((noinline)) void Small(int depth, int site) {
  if (depth == 0) {
    CaptureBoth();
  } else if (site % 3 == 0) {
    Big(depth - 1, site / 3 + depth);
  } else if (site % 3 == 1) {
    Small(depth - 1, site / 3 + depth);
    asm volatile("nop" ::: "memory");
  } else {
    Small(depth - 1, site / 3 + depth);
    asm volatile("nop; nop" ::: "memory");
  }
  asm volatile("" ::: "memory");
}
}  // namespace cfi_trail

TEST(Unwind, CfiTrailGivesThePlainWalk) {
  using namespace cfi_trail;
  g_seen.clear();
  // Repeats (the same stack twice in a row), neighbours, and walks past 64 frames.
  for (int depth : {0, 1, 2, 5, 5, 9, 20, 3, 70, 70, 100, 63, 64, 65, 2})
    for (int site : {0, 1, 2, 4, 7, 7, 5, 11, 13, 26})
      for (int which = 0; which < 2; ++which)
        for (int rep = 0; rep < 2; ++rep) which ? Big(depth, site) : Small(depth, site);
  ASSERT_FALSE(g_seen.empty());
  int repeats = 0;
  for (size_t i = 0; i < g_seen.size(); ++i) {
    const Walk& w = g_seen[i];
    ASSERT_EQ(w.trail, w.plain) << "walk " << i;
    EXPECT_TRUE(w.hash_ok) << "walk " << i;
    // The plain walk reaches main (a caller of this test): more than the recursion.
    EXPECT_GE(w.plain.size(), 4u) << "walk " << i;
    const bool same_as_before = i > 0 && g_seen[i - 1].plain == w.plain;
    if (w.same) EXPECT_TRUE(same_as_before) << "walk " << i;
    repeats += w.same;
  }
  // A stack repeated at once is recognised as the previous one.
  EXPECT_GT(repeats, 0);
}

TEST(MemoryProfile, CounterTrackInTrace) {
  std::string dir = MakeTempDir();
  ASSERT_TRUE(prof::start_trace(dir).ok());
  for (int i = 0; i < 100; ++i) mem::record_allocation(P(12, i), 1 << 20, "gpu:3");
  for (int i = 0; i < 50; ++i) mem::record_free(P(12, i));
  ASSERT_TRUE(prof::stop_trace().ok());
  std::string json = ReadGzip(prof::last_trace_files().trace_json_path);
  EXPECT_NE(json.find("\"ph\":\"C\""), std::string::npos);
  EXPECT_NE(json.find("\"name\":\"memory gpu:3\""), std::string::npos);
  EXPECT_NE(json.find("\"live_bytes\":104857600"), std::string::npos);  // the peak: 100 MiB
  EXPECT_NE(json.find("\"live_bytes\":52428800"), std::string::npos);   // after the frees
  auto space = spyglass::testing::ReadXSpace(prof::last_trace_files().xplane_path);
  const auto* host = spyglass::testing::FindPlane(space, "/host:CPU");
  ASSERT_NE(host, nullptr);
  bool counters = false;
  for (const auto& l : host->lines()) counters |= l.name() == "_counters_" && l.events_size() > 0;
  EXPECT_TRUE(counters);
  FreeAll(12, 100);
}

__attribute__((noinline)) void MyXmalloc(uintptr_t base, int i) {  // a program's allocation wrapper
  mem::record_allocation(P(base, i), 1 << 20, "gpu:7");
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void FillWeightCache(uintptr_t base, int n) {
  for (int i = 0; i < n; ++i) MyXmalloc(base, i);
  asm volatile("" ::: "memory");
}

// The trace's per-site counters are named from the call site on, past a
// program's allocation wrapper, as memtop names sites.
TEST(MemoryProfile, SiteCountersAreNamedPastWrappers) {
  std::string dir = MakeTempDir();
  ASSERT_TRUE(prof::start_trace(dir).ok());
  FillWeightCache(14, 20);
  ASSERT_TRUE(prof::stop_trace().ok());
  auto space = spyglass::testing::ReadXSpace(prof::last_trace_files().xplane_path);
  const auto* host = spyglass::testing::FindPlane(space, "/host:CPU");
  ASSERT_NE(host, nullptr);
  std::string names;
  for (const auto& [id, m] : host->event_metadata())
    if (m.name().rfind("memory gpu:7 ", 0) == 0) names += m.name() + "\n";
  EXPECT_NE(names.find("memory gpu:7 FillWeightCache"), std::string::npos) << names;
  EXPECT_EQ(names.find("MyXmalloc"), std::string::npos) << names;
  FreeAll(14, 20);
}

// When the counter's buffer fills, the track keeps the run's peak and its
// last value (drawn from the memory timeline past the fill) and says so.
TEST(MemoryProfile, CounterTrackKeepsPeakAndEndPastItsBuffer) {
  std::string dir = MakeTempDir();
  prof::TraceOptions options;
  options.profiler_options.buffer_bytes_total = 1;  // the smallest counter buffer: 1024 samples
  ASSERT_TRUE(prof::start_trace(dir, options).ok());
  constexpr int kBlocks = 3000;  // the peak comes long after the buffer is full
  for (int i = 0; i < kBlocks; ++i) mem::record_allocation(P(13, i), 1 << 20, "gpu:6");
  for (int i = 10; i < kBlocks; ++i) mem::record_free(P(13, i));
  ASSERT_TRUE(prof::stop_trace().ok());
  auto space = spyglass::testing::ReadXSpace(prof::last_trace_files().xplane_path);
  const auto* host = spyglass::testing::FindPlane(space, "/host:CPU");
  ASSERT_NE(host, nullptr);
  int64_t md = -1;
  for (const auto& [id, m] : host->event_metadata())
    if (m.name() == "memory gpu:6") md = id;
  ASSERT_GE(md, 0);
  int64_t peak = -1, last = -1, last_ps = -1;
  for (const auto& l : host->lines()) {
    if (l.name() != "_counters_") continue;
    for (const auto& e : l.events()) {
      if (e.metadata_id() != md) continue;
      for (const auto& st : e.stats()) {
        int64_t v = st.has_int64_value() ? st.int64_value() : static_cast<int64_t>(st.uint64_value());
        peak = std::max(peak, v);
        if (e.offset_ps() >= last_ps) last_ps = e.offset_ps(), last = v;
      }
    }
  }
  EXPECT_EQ(peak, int64_t{kBlocks} << 20);
  EXPECT_EQ(last, int64_t{10} << 20);
  bool said = false;
  for (const auto& st : host->stats())
    if (host->stat_metadata().at(st.metadata_id()).name() == "memory_counter_reduced_points")
      said = st.uint64_value() > 0;
  EXPECT_TRUE(said) << "the plane must say the track was reduced";
  FreeAll(13, 10);
}

TEST(MemoryProfile, SnapshotOfAMillionLiveAllocations) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "timing only in plain builds";
#endif
  constexpr int kN = 1000000;
  for (int i = 0; i < kN; ++i) mem::record_allocation(P(13, i), 64, "gpu:7");
  auto t0 = std::chrono::steady_clock::now();
  std::string bytes;
  ASSERT_TRUE(prof::device_memory_profile(&bytes, "gpu:7").ok());
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("snapshot of %d live allocations: %.3f s, %zu bytes\n", kN, s, bytes.size());
  EXPECT_LT(s, 1.0);
  mem::PprofProfile p;
  ASSERT_TRUE(mem::ParsePprof(bytes, &p).ok());
  EXPECT_EQ(Sum(p, "").first, kN);
  auto st = mem::tracking_stats();
  // At most 32 bytes of table per live allocation (stacks are shared).
  std::printf("table: %.1f bytes per live allocation (%llu live)\n",
              static_cast<double>(st.table_bytes) / static_cast<double>(st.live_allocations),
              static_cast<unsigned long long>(st.live_allocations));
  EXPECT_LE(static_cast<double>(st.table_bytes) / static_cast<double>(st.live_allocations), 32.0);
  FreeAll(13, kN);
}

TEST(Pprof, CorruptAndTruncatedFilesAreClearErrors) {
  mem::record_allocation(P(14, 0), 1);
  std::string good;
  ASSERT_TRUE(prof::device_memory_profile(&good).ok());
  mem::record_free(P(14, 0));
  mem::PprofProfile p;
  auto err = [&](std::string_view bytes) {
    spyglass::Status s = mem::ParsePprof(bytes, &p);
    EXPECT_FALSE(s.ok());
    return s.message();
  };
  EXPECT_NE(err(good.substr(0, good.size() / 2)).find("truncated"), std::string::npos);
  EXPECT_NE(err("").find("empty"), std::string::npos);
  EXPECT_NE(err("hello, I am not a profile at all").find("not a valid pprof profile"), std::string::npos);
  std::string corrupt = good;
  for (size_t i = 12; i < corrupt.size() - 8; i += 7) corrupt[i] ^= 0x5a;
  EXPECT_NE(err(corrupt).find("not a valid pprof profile"), std::string::npos);
  EXPECT_TRUE(mem::ParsePprof(good, &p).ok());
  EXPECT_EQ(mem::ReadPprofFile("/nonexistent/x.prof", &p).code(), spyglass::StatusCode::kNotFound);
}

TEST(Pprof, ReportsNameTheCallSites) {
  // Each site: leaf "operator new" (plumbing) called from the function named.
  auto profile = [](std::vector<std::tuple<std::string, int64_t, int64_t>> sites) {
    mem::ProfileData d;
    for (size_t i = 0; i < sites.size(); ++i) {
      auto& [fn, count, bytes] = sites[i];
      d.functions.push_back({fn, fn, "/src/app.cc", 1});                        // id 2i+1
      d.functions.push_back({"operator new(unsigned long)", "_Znwm", "", 0});  // id 2i+2
      d.locations.push_back({0x10, {{2 * i + 2, 0}}});                         // id 2i+1
      d.locations.push_back({0x20, {{2 * i + 1, 42}}});                        // id 2i+2
      d.samples.push_back({{2 * i + 1, 2 * i + 2}, count, bytes, "heap", "cpu:0"});
    }
    mem::PprofProfile p;
    EXPECT_TRUE(mem::ParsePprof(mem::EncodePprofGz(d), &p).ok());
    return p;
  };
  auto early = profile({{"Cache::Insert", 10, 1000}, {"LoadConfig", 1, 500}});
  auto late = profile({{"Cache::Insert", 90, 9000}, {"LoadConfig", 1, 500}, {"Session::Open", 2, 64}});
  std::string top = mem::MemTopReport(late, "late.prof", 10);
  EXPECT_NE(top.find("Cache::Insert  app.cc:42"), std::string::npos) << top;
  EXPECT_NE(top.find("8.8 KiB"), std::string::npos) << top;
  EXPECT_EQ(top.find("operator new"), std::string::npos) << top;  // plumbing skipped
  std::string diff = mem::MemDiffReport(early, late, "early.prof", "late.prof", 10);
  size_t grew = diff.find("Grew");
  size_t cache = diff.find("+7.8 KiB");
  ASSERT_NE(grew, std::string::npos) << diff;
  ASSERT_NE(cache, std::string::npos) << diff;
  EXPECT_NE(diff.find("+80"), std::string::npos) << diff;
  EXPECT_LT(cache, diff.find("Session::Open")) << diff;  // largest growth first
  EXPECT_EQ(diff.find("LoadConfig"), std::string::npos) << diff;  // unchanged sites are not growth
}

// The call site skips programs' allocation wrappers, names the innermost
// Python frame of a Python program, and shows N frames or the whole stack.
TEST(Pprof, CallSitesSkipWrappersAndNamePythonFrames) {
  auto sample = [](std::vector<mem::PprofFrame> frames) {
    mem::PprofSample s;
    s.frames = std::move(frames);
    return s;
  };
  // cc1plus: malloc <- xmalloc <- the compiler's own function.
  auto gcc = sample({{"malloc", "", 0}, {"xmalloc", "", 0}, {"ggc_internal_alloc", "", 0}, {"main", "", 0}});
  EXPECT_EQ(mem::CallSite(gcc), "ggc_internal_alloc");
  auto sqlite = sample({{"malloc", "", 0}, {"sqlite3MemMalloc", "", 0}, {"sqlite3Malloc", "", 0},
                        {"sqlite3DbMallocRawNN", "", 0}, {"sqlite3VdbeExec", "vdbe.c", 12}, {"main", "", 0}});
  EXPECT_EQ(mem::CallSite(sqlite), "sqlite3VdbeExec  vdbe.c:12");
  auto glib = sample({{"malloc", "", 0}, {"g_malloc0", "", 0}, {"g_hash_table_new_full", "", 0}});
  EXPECT_EQ(mem::CallSite(glib), "g_hash_table_new_full");
  // json.tool: CPython's internals, then the script's frames.
  auto py = sample({{"malloc", "", 0}, {"PyUnicode_New", "", 0}, {"scanstring_unicode", "", 0},
                    {"raw_decode", "/usr/lib/python3.11/json/decoder.py", 353},
                    {"main", "/usr/lib/python3.11/json/tool.py", 67}, {"_run_module_as_main", "<frozen runpy>", 198}});
  EXPECT_EQ(mem::CallSite(py), "raw_decode  decoder.py:353");
  EXPECT_EQ(mem::CallSite(py, {.frames = 2}), "raw_decode  decoder.py:353 <- main  tool.py:67");
  EXPECT_EQ(mem::CallSite(py, {.frames = 1, .native = true}), "PyUnicode_New");
  EXPECT_EQ(mem::CallSite(py, {.frames = 0}),
            "malloc <- PyUnicode_New <- scanstring_unicode <- raw_decode  decoder.py:353 <- main  tool.py:67 <- "
            "_run_module_as_main  <frozen runpy>:198");
  // A JAX buffer (jaxlib's heap profile): JAX's frames, then the program's.
  auto jax = sample({{"__call__", "/venv/lib/python3.11/site-packages/jax/_src/interpreters/pxla.py", 395},
                     {"apply_primitive", "/venv/lib/python3.11/site-packages/jax/_src/dispatch.py", 88},
                     {"grow_cache", "/src/train.py", 7}, {"<module>", "<string>", 12}});
  EXPECT_EQ(mem::CallSite(jax), "grow_cache  train.py:7");
  EXPECT_EQ(mem::CallSite(jax, {.frames = 2}), "grow_cache  train.py:7 <- <module>  <string>:12");
  auto jax_only = sample({{"backend_compile_and_load", "/usr/lib/python3/dist-packages/jax/_src/compiler.py", 353}});
  EXPECT_EQ(mem::CallSite(jax_only), "backend_compile_and_load  compiler.py:353");
  // A stack of plumbing only keeps its innermost frame.
  EXPECT_EQ(mem::CallSite(sample({{"malloc", "", 0}, {"xmalloc", "", 0}})), "malloc");
  // A user function whose name merely holds "alloc" as a word part is kept.
  EXPECT_EQ(mem::CallSite(sample({{"malloc", "", 0}, {"AllocationTable::Grow", "t.cc", 3}})), "AllocationTable::Grow  t.cc:3");
}

// Explicit (symbolic) stacks, as the Python binding records them: each frame
// becomes Function(name, file) + Location(line), leaf first, deduplicated.
TEST(MemoryProfile, ExplicitFramesBecomeFunctionsAndLines) {
  const mem::Frame grow[] = {{"make_arrays", "/src/model.py", 12}, {"train", "/src/model.py", 30},
                             {"<module>", "/src/run.py", 3}};
  const mem::Frame other[] = {{"make_arrays", "/src/model.py", 14}, {"train", "/src/model.py", 30},
                              {"<module>", "/src/run.py", 3}};
  auto before = mem::tracking_stats();
  for (int i = 0; i < 3; ++i) mem::record_allocation_with_frames(P(20, i), 1000, "cpu:0", "buffer", grow);
  mem::record_allocation_with_frames(P(20, 3), 500, "cpu:0", "buffer", other);
  mem::record_allocation_with_frames(P(20, 4), 7, "cpu:0", "buffer", {});  // no stack
  auto after = mem::tracking_stats();
  EXPECT_EQ(after.distinct_stacks - before.distinct_stacks, 2u);       // deduplicated
  EXPECT_EQ(after.distinct_functions - before.distinct_functions, 3u);  // interned once each
  EXPECT_EQ(after.dropped_functions, before.dropped_functions);

  mem::PprofProfile p = Snapshot("cpu:0");
  int seen = 0;
  for (const auto& s : p.samples) {
    if (s.frames.empty() || s.frames[0].function != "make_arrays") continue;
    ASSERT_EQ(s.frames.size(), 3u);  // exactly the given frames, nothing native
    EXPECT_EQ(s.frames[0].file, "/src/model.py");
    EXPECT_EQ(s.frames[1].function, "train");
    EXPECT_EQ(s.frames[1].line, 30);
    EXPECT_EQ(s.frames[2].function, "<module>");
    EXPECT_EQ(s.frames[2].file, "/src/run.py");
    EXPECT_EQ(s.labels.at("kind"), "buffer");
    EXPECT_EQ(s.labels.at("device"), "cpu:0");
    if (s.frames[0].line == 12) {
      EXPECT_EQ(s.values, (std::vector<int64_t>{3, 3000}));
      EXPECT_EQ(mem::CallSite(s), "make_arrays  model.py:12");
    } else {
      EXPECT_EQ(s.frames[0].line, 14);
      EXPECT_EQ(s.values, (std::vector<int64_t>{1, 500}));
    }
    ++seen;
  }
  EXPECT_EQ(seen, 2);
  FreeAll(20, 5);
  for (const auto& s : Snapshot("cpu:0").samples)
    for (const auto& f : s.frames) EXPECT_NE(f.function, "make_arrays");
}

TEST(MemoryProfile, ExplicitFramesAreBoundedAndThreadSafe) {
  // Long names are cut, deep stacks keep 64 frames, lines clamp at 0.
  std::string long_name(5000, 'f');
  std::vector<mem::Frame> deep(100, mem::Frame{"recurse", "/src/deep.py", -5});
  deep[0] = {long_name, "/src/deep.py", 1};
  mem::record_allocation_with_frames(P(21, 0), 64, "cpu:0", "buffer", deep);
  bool found = false;
  for (const auto& s : Snapshot("cpu:0").samples) {
    if (s.frames.empty() || s.frames[0].function.rfind("fff", 0) != 0) continue;
    found = true;
    EXPECT_EQ(s.frames[0].function.size(), 1024u);
    EXPECT_EQ(s.frames.size(), 64u);
    EXPECT_EQ(s.frames[1].line, 0);
  }
  EXPECT_TRUE(found);
  mem::record_free(P(21, 0));

  // Threads interning the same functions at once get one id per function.
  auto before = mem::tracking_stats();
  constexpr int kThreads = 8, kOps = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < kOps; ++i) {
        std::string fn = "worker_fn_" + std::to_string(i % 50);
        mem::Frame frames[] = {{fn, "/src/threads.py", i % 7}, {"run", "/usr/lib/python3/threading.py", 975}};
        mem::record_allocation_with_frames(P(200 + t, i), 32, "cpu:0", "buffer", frames);
        if (i >= 10) mem::record_free(P(200 + t, i - 10));
      }
    });
  for (auto& th : threads) th.join();
  auto after = mem::tracking_stats();
  EXPECT_EQ(after.distinct_functions - before.distinct_functions, 51u);
  EXPECT_LE(after.distinct_stacks - before.distinct_stacks, 50u * 7);
  EXPECT_EQ(after.live_allocations - before.live_allocations, uint64_t{kThreads} * 10);
  EXPECT_EQ(after.unknown_frees, before.unknown_frees);
  for (int t = 0; t < kThreads; ++t)
    for (int i = kOps - 10; i < kOps; ++i) mem::record_free(P(200 + t, i));
}

TEST(MemoryProfile, RemoveIfTrackedCountsNoUnknownFrees) {
  namespace in = spyglass::memory::internal;
  auto before = mem::tracking_stats();
  in::Guard::Enter();
  EXPECT_FALSE(in::RemoveIfTracked(Addr(22, 0)));
  in::Guard::Leave();
  mem::record_allocation(P(22, 1), 10);
  in::Guard::Enter();
  EXPECT_TRUE(in::RemoveIfTracked(Addr(22, 1)));
  in::Guard::Leave();
  auto after = mem::tracking_stats();
  EXPECT_EQ(after.unknown_frees, before.unknown_frees);
  EXPECT_EQ(after.frees - before.frees, 1u);
  EXPECT_EQ(after.live_allocations, before.live_allocations);
}

namespace {
__attribute__((noinline)) void AllocateBeforeRealloc(uintptr_t base) {
  mem::record_allocation(P(base, 0), 777, "cpu:0", "heap");
  asm volatile("" ::: "memory");
}
}  // namespace

// A failed realloc puts back exactly what it took out: size, stack, counts.
TEST(MemoryProfile, TakeAndRestoreKeepSizeAndStack) {
  namespace in = spyglass::memory::internal;
  AllocateBeforeRealloc(24);
  auto before = mem::tracking_stats();
  in::LiveRecord r{};
  in::Guard::Enter();
  ASSERT_TRUE(in::Take(Addr(24, 0), &r));
  EXPECT_FALSE(in::Take(Addr(24, 1), &r));  // untracked: nothing taken, nothing counted
  in::Guard::Leave();
  EXPECT_EQ(r.size, 777u);
  EXPECT_EQ(Sum(Snapshot(), "AllocateBeforeRealloc").second, 0);
  in::Guard::Enter();
  in::Restore(r);
  in::Guard::Leave();
  EXPECT_EQ(Sum(Snapshot(), "AllocateBeforeRealloc"), std::make_pair(int64_t{1}, int64_t{777}));
  auto after = mem::tracking_stats();
  EXPECT_EQ(after.frees, before.frees);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.unknown_frees, before.unknown_frees);
  EXPECT_EQ(after.live_allocations, before.live_allocations);
  mem::record_free(P(24, 0));
}

TEST(MemoryProfile, SampleBytesAreValidated) {
  namespace in = spyglass::memory::internal;
  uint64_t v = 99;
  EXPECT_TRUE(in::ParseSampleBytes("0", &v) && v == 0);
  EXPECT_TRUE(in::ParseSampleBytes("524288", &v) && v == 524288);
  EXPECT_TRUE(in::ParseSampleBytes("1073741824", &v) && v == in::kMaxSampleBytes);
  for (const char* bad : {"", "-5", "+5", " 5", "5 ", "1073741825", "18446744073709551615",
                          "99999999999999999999999999", "0x10", "1e6", "12x"})
    EXPECT_FALSE(in::ParseSampleBytes(bad, &v)) << bad;
  EXPECT_FALSE(in::ParseSampleBytes(nullptr, &v));
}
