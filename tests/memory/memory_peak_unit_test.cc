// The peak (the live set at the high-water mark, kept lazily), the timeline
// and its file format, the profile file names, and the single-writer mode's
// switch to shared mode (issue 10), through the explicit API.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <thread>
#include <vector>

#include "memory/pprof.h"
#include "memory/timeline.h"
#include "memory/tracker.h"
#include "spyglass/memory.h"

namespace mem = spyglass::memory;

namespace {

// noipa: three identical bodies would otherwise be folded into one function.
const void* P(uintptr_t base, uintptr_t i) { return reinterpret_cast<const void*>((base << 32) + i * 64); }

__attribute__((noipa)) void WeightsSite(uintptr_t base, int n, size_t bytes, const char* dev) {
  for (int i = 0; i < n; ++i) mem::record_allocation(P(base, i), bytes, dev, "buffer");
  asm volatile("" ::: "memory");
}
__attribute__((noipa)) void ActivationsSite(uintptr_t base, int n, size_t bytes, const char* dev) {
  for (int i = 0; i < n; ++i) mem::record_allocation(P(base, i), bytes, dev, "buffer");
  asm volatile("" ::: "memory");
}
__attribute__((noipa)) void ScratchSite(uintptr_t base, int n, size_t bytes, const char* dev) {
  for (int i = 0; i < n; ++i) mem::record_allocation(P(base, i), bytes, dev, "buffer");
  asm volatile("" ::: "memory");
}
void FreeAll(uintptr_t base, int n) {
  for (int i = 0; i < n; ++i) mem::record_free(P(base, i));
}

// (count, bytes) of the samples through `fn` in a profile.
std::pair<int64_t, int64_t> Sum(const std::string& gz, const std::string& fn) {
  mem::PprofProfile p;
  spyglass::Status s = mem::ParsePprof(gz, &p);
  EXPECT_TRUE(s.ok()) << s.ToString();
  int64_t c = 0, b = 0;
  for (const auto& smp : p.samples)
    for (const auto& f : smp.frames)
      if (f.function.find(fn) != std::string::npos) {
        c += smp.values[0];
        b += smp.values[1];
        break;
      }
  return {c, b};
}

mem::DeviceMemory Device(const std::string& name) {
  for (const mem::DeviceMemory& d : mem::device_memory())
    if (d.device == name) return d;
  return {};
}

std::string Peak(std::string_view backend) {
  std::string gz;
  EXPECT_TRUE(mem::peak_memory_profile(&gz, backend).ok());
  return gz;
}

}  // namespace

TEST(MemoryPeak, PeakProfileIsTheLiveSetAtTheHighWaterMark) {
  const char* dev = "peaktest:0";
  WeightsSite(7001, 3, 1000, dev);      // 3,000 live
  ActivationsSite(7002, 2, 5000, dev);  // 13,000: the peak
  FreeAll(7002, 2);                     // 3,000
  ScratchSite(7003, 1, 2000, dev);      // 5,000
  EXPECT_EQ(Device(dev).live_bytes, 5000);
  EXPECT_EQ(Device(dev).peak_bytes, 13000);
  std::string gz = Peak(dev);
  EXPECT_EQ(Sum(gz, "WeightsSite"), std::make_pair(int64_t{3}, int64_t{3000}));
  EXPECT_EQ(Sum(gz, "ActivationsSite"), std::make_pair(int64_t{2}, int64_t{10000}));
  EXPECT_EQ(Sum(gz, "ScratchSite"), std::make_pair(int64_t{0}, int64_t{0}));
  // The live snapshot is what is alive now.
  std::string now;
  ASSERT_TRUE(spyglass::profiler::device_memory_profile(&now, dev).ok());
  EXPECT_EQ(Sum(now, "ActivationsSite"), std::make_pair(int64_t{0}, int64_t{0}));
  EXPECT_EQ(Sum(now, "ScratchSite"), std::make_pair(int64_t{1}, int64_t{2000}));

  // A new, higher peak replaces the old one.
  ScratchSite(7004, 20, 1000, dev);  // 25,000
  EXPECT_EQ(Device(dev).peak_bytes, 25000);
  gz = Peak(dev);
  EXPECT_EQ(Sum(gz, "WeightsSite"), std::make_pair(int64_t{3}, int64_t{3000}));
  EXPECT_EQ(Sum(gz, "ActivationsSite"), std::make_pair(int64_t{0}, int64_t{0}));
  EXPECT_EQ(Sum(gz, "ScratchSite"), std::make_pair(int64_t{21}, int64_t{22000}));
  // Freeing everything leaves the peak profile as it was.
  FreeAll(7001, 3);
  FreeAll(7003, 1);
  FreeAll(7004, 20);
  EXPECT_EQ(Device(dev).live_bytes, 0);
  EXPECT_EQ(Sum(Peak(dev), "ScratchSite"), std::make_pair(int64_t{21}, int64_t{22000}));
  // Its comment gives the peak.
  mem::PprofProfile p;
  ASSERT_TRUE(mem::ParsePprof(Peak(dev), &p).ok());
  bool found = false;
  for (std::string_view c : p.comments) found |= c == "spyglass: peak peaktest:0 25000 bytes";
  EXPECT_TRUE(found);
}

TEST(MemoryPeak, EachDeviceHasItsOwnPeak) {
  WeightsSite(7101, 4, 1000, "peakdev:0");  // peakdev:0 peaks at 4,000 ...
  FreeAll(7101, 4);
  ActivationsSite(7102, 2, 3000, "peakdev:1");  // ... before peakdev:1 peaks at 6,000
  FreeAll(7102, 2);
  std::string gz = Peak("peakdev");  // both devices, each at its own peak
  EXPECT_EQ(Sum(gz, "WeightsSite"), std::make_pair(int64_t{4}, int64_t{4000}));
  EXPECT_EQ(Sum(gz, "ActivationsSite"), std::make_pair(int64_t{2}, int64_t{6000}));
  EXPECT_EQ(Sum(Peak("peakdev:1"), "WeightsSite"), std::make_pair(int64_t{0}, int64_t{0}));
  std::string path = ::testing::TempDir() + "/peak_" + std::to_string(getpid()) + ".prof";
  ASSERT_TRUE(mem::save_peak_profile(path, "peakdev:0").ok());
  mem::PprofProfile p;
  ASSERT_TRUE(mem::ReadPprofFile(path, &p, {}).ok());
  EXPECT_EQ(p.samples.size(), 1u);
  std::remove(path.c_str());
}

// A forked child starts with one thread, in single-writer mode: its main
// thread records first, then threads record at once (the switch to shared
// mode happens under load); every total must come out exact.
TEST(MemoryPeak, SwitchToSharedModeLosesNothing) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const char* dev = "switch:0";
    WeightsSite(7201, 1000, 100, dev);  // the child's main thread: the single writer
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([t, dev] {
        for (int i = 0; i < 20000; ++i) {
          ActivationsSite(7210 + t, 1, 10, dev);  // same pointer: allocate, free, again
          mem::record_free(P(7210 + t, 0));
        }
      });
    for (int i = 0; i < 20000; ++i) {  // the writer goes on meanwhile
      ScratchSite(7202, 1, 10, dev);
      mem::record_free(P(7202, 0));
    }
    for (auto& th : threads) th.join();
    bool ok = Device(dev).live_bytes == 100000 && Sum(Peak(dev), "WeightsSite").second == 100000;
    std::string now;
    ok = ok && spyglass::profiler::device_memory_profile(&now, dev).ok() &&
         Sum(now, "WeightsSite") == std::make_pair(int64_t{1000}, int64_t{100000}) &&
         Sum(now, "ActivationsSite").first == 0 && mem::tracking_stats().unknown_frees == 0;
    FreeAll(7201, 1000);
    ok = ok && Device(dev).live_bytes == 0;
    _exit(ok ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

TEST(MemoryTimeline, PointsHaveDevicesAndTopSites) {
  WeightsSite(7301, 10, 4096, "tl:0");
  mem::TimelineSampleNow();
  FreeAll(7301, 10);
  mem::TimelineSampleNow();
  mem::Timeline t = mem::CurrentTimeline(true);
  int dev = -1;
  for (size_t d = 0; d < t.devices.size(); ++d)
    if (t.devices[d] == "tl:0") dev = static_cast<int>(d);
  ASSERT_GE(dev, 0);
  ASSERT_GE(t.points.size(), 2u);
  const mem::TimelinePoint& a = t.points[t.points.size() - 2];
  const mem::TimelinePoint& b = t.points.back();
  EXPECT_EQ(a.live[dev], 40960);
  EXPECT_EQ(b.live[dev], 0);
  EXPECT_EQ(t.peak_bytes[dev], 40960);
  // The first point's top sites name WeightsSite.
  bool named = false;
  for (const auto& [id, bytes] : a.sites)
    for (const mem::TimelineSite& s : t.sites)
      if (s.id == id && bytes == 40960) named |= s.stack.find("WeightsSite") != std::string::npos;
  EXPECT_TRUE(named);
  EXPECT_LE(b.t_ns - a.t_ns, int64_t{60} * 1000000000);

  // The file text reads back the same.
  mem::Timeline back;
  spyglass::Status s = mem::ParseTimeline(mem::FormatTimeline(t), &back);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(back.devices, t.devices);
  EXPECT_EQ(back.peak_bytes, t.peak_bytes);
  ASSERT_EQ(back.points.size(), t.points.size());
  EXPECT_EQ(back.points.back().live, t.points.back().live);
  EXPECT_EQ(back.points[back.points.size() - 2].sites, a.sites);
  ASSERT_EQ(back.sites.size(), t.sites.size());
  EXPECT_EQ(back.sites[0].stack, t.sites[0].stack);
}

TEST(MemoryTimeline, RingStaysBoundedAndKeepsTheMaximum) {
  for (int i = 0; i < 3 * mem::kTimelinePoints; ++i) {
    WeightsSite(7401, 1, i == 100 ? 1 << 20 : 64, "ring:0");
    mem::TimelineSampleNow();
    FreeAll(7401, 1);
  }
  mem::Timeline t = mem::CurrentTimeline(false);
  EXPECT_LE(t.points.size(), static_cast<size_t>(mem::kTimelinePoints));
  EXPECT_GT(t.interval_ns, mem::kTimelineFirstIntervalNs);  // merged at least once
  int dev = -1;
  for (size_t d = 0; d < t.devices.size(); ++d)
    if (t.devices[d] == "ring:0") dev = static_cast<int>(d);
  ASSERT_GE(dev, 0);
  int64_t max = 0;
  for (const auto& p : t.points) max = std::max(max, p.max[dev]);
  EXPECT_EQ(max, 1 << 20);  // the one big block survives the merges as a maximum
}

TEST(MemoryTimeline, MalformedFilesAreClearErrors) {
  const std::string good =
      "# spyglass memory timeline 1\n# start_monotonic_ns\t5\n# interval_ns\t1000000\n# device\tcpu:0\t300\n"
      "# site\t256\tcpu:0\tf <- main\nt_ns\tcpu:0 live\tcpu:0 max\tsite 256\n0\t100\t300\t100\n10\t0\t100\t\n";
  mem::Timeline t;
  ASSERT_TRUE(mem::ParseTimeline(good, &t).ok());
  EXPECT_EQ(t.points.size(), 2u);
  EXPECT_EQ(t.points[0].sites.size(), 1u);
  EXPECT_TRUE(t.points[1].sites.empty());
  struct Bad {
    std::string text, expect;
  };
  const std::string huge(1 << 20, 'x');
  for (const Bad& b : std::vector<Bad>{
           {"", "not a spyglass memory timeline"},
           {"P1 " + huge, "(1048579 bytes)"},
           {good.substr(0, good.find("t_ns")), "no header line"},
           {good + "20\t1\n", "wrong number of columns"},
           {good + "20\tx\t1\t\n", "not an integer"},
           {good + "20\t1\t1\t99999999999999999999999\n", "not an integer"},
           {"# spyglass memory timeline 1\n# device\tcpu:0\n", "unknown metadata"},
           {"# spyglass memory timeline 1\n# device\tcpu:0\t1\nt_ns\tgpu:0 live\tgpu:0 max\n", "does not match"},
           {"# spyglass memory timeline 1\nt_ns\n0\n# device\tcpu:0\t1\n", "metadata after the header"},
           {"# spyglass memory timeline 1\n# site\t7\tcpu:0\tf\nt_ns\tsite 8\n", "does not match the sites"},
       }) {
    mem::Timeline out;
    spyglass::Status s = mem::ParseTimeline(b.text, &out);
    ASSERT_FALSE(s.ok()) << b.expect;
    EXPECT_NE(s.message().find(b.expect), std::string::npos) << s.message();
    EXPECT_LT(s.message().size(), 400u);
  }
  mem::Timeline out;
  EXPECT_FALSE(mem::ReadTimelineFile("/nonexistent/x.timeline.tsv", &out).ok());
  // A file over the size limit is refused without being read whole.
  std::string path = ::testing::TempDir() + "/big_" + std::to_string(getpid()) + ".timeline.tsv";
  {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::string line = good + std::string(1 << 20, '#') + "\n";
    for (size_t n = 0; n <= mem::kMaxTimelineBytes; n += line.size()) std::fwrite(line.data(), 1, line.size(), f);
    std::fclose(f);
  }
  spyglass::Status s = mem::ReadTimelineFile(path, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("over the limit"), std::string::npos) << s.message();
  std::remove(path.c_str());
  mem::Timeline ok;
  std::string small = ::testing::TempDir() + "/ok_" + std::to_string(getpid()) + ".timeline.tsv";
  {
    FILE* f = std::fopen(small.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fwrite(good.data(), 1, good.size(), f);
    std::fclose(f);
  }
  EXPECT_TRUE(mem::ReadTimelineFile(small, &ok).ok());
  EXPECT_EQ(ok.points.size(), 2u);
  std::remove(small.c_str());
}

TEST(MemoryFiles, NamesCarryPidAndProgram) {
  EXPECT_EQ(mem::MemoryProfileName(12, "python3.11", "peak"), "memory.12.python3.11.peak.prof");
  EXPECT_EQ(mem::MemoryProfileName(7, "a b/../c", "exit"), "memory.7.a_b_.._c.exit.prof");
  EXPECT_EQ(mem::MemoryTimelineName(7, ""), "memory.7.unknown.timeline.tsv");
  EXPECT_EQ(mem::SafeComm(".."), "unknown");
  EXPECT_EQ(mem::SelfComm(), mem::SafeComm(mem::SelfComm()));
  EXPECT_FALSE(mem::SelfComm().empty());
}

// Fork while the single writer holds its latest allocation out of the table:
// the child and the parent still find it. Inside a forked child, which starts
// in single-writer mode (earlier tests' snapshots made this process shared).
bool ForkWhilePending() {
  const char* dev = "forkpend:0";
  WeightsSite(7501, 1, 4321, dev);  // the latest allocation of this thread: pending
  const uint64_t unknown = mem::tracking_stats().unknown_frees;
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    FreeAll(7501, 1);
    bool ok = Device(dev).live_bytes == 0 && mem::tracking_stats().unknown_frees == unknown;
    std::string now;
    ok = ok && spyglass::profiler::device_memory_profile(&now, dev).ok() && Sum(now, "WeightsSite").first == 0;
    _exit(ok ? 0 : 3);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  std::string now;
  bool ok = spyglass::profiler::device_memory_profile(&now, dev).ok() &&
            Sum(now, "WeightsSite") == std::make_pair(int64_t{1}, int64_t{4321});
  FreeAll(7501, 1);
  return ok && Device(dev).live_bytes == 0 && mem::tracking_stats().unknown_frees == unknown;
}

TEST(MemoryPeak, ForkKeepsTheWritersLatestAllocation) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(ForkWhilePending() ? 0 : 3);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}
