// The CPU sampler inside a session: the model layout of samples in the
// .xplane.pb (docs/sampling.md), the annotation open on a sample's thread,
// threads started during the session, the pprof profile beside the trace,
// and the sampler's options (registered with its tracer).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "memory/pprof.h"
#include "model/xspace.h"
#include "sampling/cpu_model.h"
#include "sampling/cpu_sampler.h"
#include "sampling/python_stacks.h"
#include "spyglass/profiler.h"
#include "model/schema.h"
#include "model/xspace.h"
#include "sampling/cpu_model.h"
#include "server/merge.h"
#include "test_util.h"

namespace prof = spyglass::profiler;
namespace fs = std::filesystem;
using spyglass::testing::FindPlane;
using spyglass::testing::MakeTempDir;
using spyglass::testing::ReadXSpace;
using spyglass::testing::StatText;

namespace {

uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

volatile uint64_t g_sink;

extern "C" __attribute__((noinline)) void SamplerTestBurn(uint64_t ns) {
  const uint64_t start = ThreadCpuNs();
  uint64_t x = start;
  while (ThreadCpuNs() - start < ns)
    for (int i = 0; i < 20000; ++i) x = x * 6364136223846793005ull + 1;
  g_sink = x;
  asm volatile("" ::: "memory");
}

prof::TraceOptions Sampling(int64_t hz) {
  prof::TraceOptions o;
  o.profiler_options.advanced_configuration.emplace("spyglass_cpu_sample_hz", hz);
  return o;
}

// The frames of a sample (its event's metadata and the parent chain), innermost first.
std::vector<std::string> StackOf(const tensorflow::profiler::XPlane& p, int64_t id) {
  std::vector<std::string> out;
  for (int guard = 0; id != 0 && guard < 1000; ++guard) {
    const auto& md = p.event_metadata().at(id);
    out.push_back(md.display_name());
    int64_t parent = 0;
    for (const auto& s : md.stats())
      if (p.stat_metadata().at(s.metadata_id()).name() == "cpu_stack_parent") parent = static_cast<int64_t>(s.uint64_value());
    id = parent;
  }
  return out;
}

TEST(CpuSampler, SamplesSitOnTheirThreadsWithStacksAndAnnotations) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(prof::start_trace(dir, Sampling(999)).ok());
  const int64_t main_tid = syscall(SYS_gettid);
  {
    prof::TraceAnnotation outer("outer");
    prof::TraceAnnotation inner("inner");
    SamplerTestBurn(200'000'000);
  }
  // A thread started during the session is sampled too (found within the
  // reader's rescan interval).
  int64_t late_tid = 0;
  std::thread late([&] {
    late_tid = syscall(SYS_gettid);
    SamplerTestBurn(300'000'000);
  });
  late.join();
  ASSERT_TRUE(prof::stop_trace().ok());

  auto space = ReadXSpace(prof::last_trace_files().xplane_path);
  const auto* host = FindPlane(space, "/host:CPU");
  ASSERT_NE(host, nullptr);
  std::map<std::string, std::string> plane_stats;
  for (const auto& s : host->stats()) plane_stats[host->stat_metadata().at(s.metadata_id()).name()] = StatText(*host, s);
  EXPECT_EQ(plane_stats["cpu_sample_period_ns"], std::to_string(1000000000 / 999));
  // The kernel drops samples only when the reader stays off the CPU for
  // tens of ms (a busy machine): few, and counted.
  EXPECT_LE(std::stoll(plane_stats["cpu_samples_lost"]), std::stoll(plane_stats["cpu_samples"]) / 50);
  EXPECT_NE(plane_stats["cpu_sample_mechanism"].find("perf_event_open"), std::string::npos);

  std::map<int64_t, const tensorflow::profiler::XLine*> sample_lines;
  for (const auto& l : host->lines())
    if (l.name() == "CPU samples") sample_lines[l.id() - (int64_t{1} << 32)] = &l;
  ASSERT_TRUE(sample_lines.count(main_tid));
  ASSERT_TRUE(sample_lines.count(late_tid)) << "the thread started during the session has no samples";

  int in_burn = 0, annotated = 0;
  for (const auto& e : sample_lines[main_tid]->events()) {
    EXPECT_EQ(e.duration_ps(), int64_t{1000000000 / 999} * 1000);
    std::vector<std::string> stack = StackOf(*host, e.metadata_id());
    if (stack.empty() || stack[0] != "SamplerTestBurn") continue;
    ++in_burn;
    EXPECT_EQ(stack.back(), "_start");  // complete to the process's entry
    for (const auto& s : e.stats())
      if (host->stat_metadata().at(s.metadata_id()).name() == "annotation_stack" && StatText(*host, s) == "outer::inner")
        ++annotated;
  }
  EXPECT_GT(in_burn, 150);  // 200 ms at 999 Hz: about 200
  EXPECT_GE(annotated, in_burn * 95 / 100);
  int late_in_burn = 0;
  for (const auto& e : sample_lines[late_tid]->events())
    late_in_burn += StackOf(*host, e.metadata_id()).front() == "SamplerTestBurn";
  EXPECT_GT(late_in_burn, 200);  // 300 ms, less the first rescan interval

  // The pprof profile of the process, beside the trace.
  std::string pprof_path;
  for (const auto& f : fs::directory_iterator(prof::last_trace_files().run_dir))
    if (f.path().filename().string().rfind("cpu." + std::to_string(getpid()) + ".", 0) == 0) pprof_path = f.path();
  ASSERT_FALSE(pprof_path.empty());
  spyglass::memory::PprofProfile p;
  ASSERT_TRUE(spyglass::memory::ReadPprofFile(pprof_path, &p).ok());
  ASSERT_EQ(p.sample_types.size(), 2u);
  EXPECT_EQ(p.sample_types[0], (std::pair<std::string, std::string>{"samples", "count"}));
  EXPECT_EQ(p.sample_types[1], (std::pair<std::string, std::string>{"cpu", "nanoseconds"}));
  int64_t annotated_in_pprof = 0;
  for (const auto& s : p.samples)
    if (s.labels.count("annotation") && s.labels.at("annotation") == "outer::inner" && !s.frames.empty() &&
        s.frames[0].function == "SamplerTestBurn")
      annotated_in_pprof += s.values[0];
  EXPECT_EQ(annotated_in_pprof, annotated);
}

extern "C" __attribute__((noinline)) ssize_t SamplerTestBlockedRead(int fd, char* buf, size_t n) {
  ssize_t r = read(fd, buf, n);
  asm volatile("" ::: "memory");  // no tail call: this frame stays on the stack
  return r;
}

uint64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Wall mode: a thread blocked in read() is sampled off the CPU, under an
// "[off CPU: read]" frame above its own; as many samples as its time blocked
// at the rate (no more: a thread waiting for a CPU is not blocked); the read
// returns what was written (no signal interrupted it). A thread that ends
// during the session is let go.
TEST(CpuSampler, WallModeSamplesABlockedThreadWithItsStack) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::atomic<int64_t> reader_tid{0};
  std::atomic<bool> go{false};
  ssize_t got = 0;
  char buf[16] = {0};
  uint64_t read_ns = 0;
  std::thread blocked([&] {
    reader_tid = syscall(SYS_gettid);
    while (!go) std::this_thread::yield();
    const uint64_t t0 = MonoNs();
    got = SamplerTestBlockedRead(fds[0], buf, sizeof buf - 1);
    read_ns = MonoNs() - t0;
  });
  while (reader_tid == 0) std::this_thread::yield();
  prof::TraceOptions o = Sampling(999);
  o.profiler_options.advanced_configuration.emplace("spyglass_cpu_sample_mode", "wall");
  ASSERT_TRUE(prof::start_trace(MakeTempDir(), o).ok());
  go = true;
  std::thread short_lived([] { usleep(20000); });
  short_lived.join();
  usleep(300000);
  ASSERT_EQ(write(fds[1], "hello", 5), 5);
  blocked.join();
  ASSERT_TRUE(prof::stop_trace().ok());
  close(fds[0]);
  close(fds[1]);
  EXPECT_EQ(got, 5);
  EXPECT_STREQ(buf, "hello");

  auto space = ReadXSpace(prof::last_trace_files().xplane_path);
  const auto* host = FindPlane(space, "/host:CPU");
  ASSERT_NE(host, nullptr);
  std::map<std::string, std::string> plane_stats;
  for (const auto& st : host->stats()) plane_stats[host->stat_metadata().at(st.metadata_id()).name()] = StatText(*host, st);
  EXPECT_EQ(plane_stats["cpu_sample_mode"], "wall");
  EXPECT_NE(plane_stats["cpu_sample_mechanism"].find("wall mode: threads blocked in the kernel"), std::string::npos)
      << plane_stats["cpu_sample_mechanism"];
  int64_t off_read = 0, with_caller = 0;
  for (const auto& l : host->lines()) {
    if (l.name() != "CPU samples" || l.id() - (int64_t{1} << 32) != reader_tid) continue;
    for (const auto& e : l.events()) {
      std::vector<std::string> stack = StackOf(*host, e.metadata_id());
      if (stack.empty() || stack[0] != "[off CPU: read]") continue;
      ++off_read;
      for (const std::string& f : stack) with_caller += f == "SamplerTestBlockedRead";
    }
  }
  // read_ns: its time blocked, plus the wait for a CPU once woken (not sampled).
  const double at_rate = static_cast<double>(read_ns) * 999 / 1e9;
  std::printf("off-CPU samples in read: %lld; read took %.1f ms (%.0f samples at the rate)\n",
              static_cast<long long>(off_read), read_ns / 1e6, at_rate);
  EXPECT_GE(off_read, static_cast<int64_t>(at_rate * 0.8)) << "read took " << read_ns / 1000000 << " ms";
  EXPECT_LE(off_read, static_cast<int64_t>(at_rate * 1.02) + 2) << "read took " << read_ns / 1000000 << " ms";
  EXPECT_EQ(with_caller, off_read);
}

TEST(CpuSampler, OptionsAreCheckedNamingTheKey) {
  struct Case {
    const char* key;
    prof::AdvancedValue value;
  };
  const Case cases[] = {
      {"spyglass_cpu_sample_hz", int64_t{-1}},
      {"spyglass_cpu_sample_hz", int64_t{100000000}},
      {"spyglass_cpu_sample_hz", "fast"},
      {"spyglass_cpu_sample_mode", "sometimes"},
  };
  for (const Case& c : cases) {
    prof::TraceOptions o = Sampling(99);
    o.profiler_options.advanced_configuration.insert_or_assign(c.key, c.value);
    auto s = prof::start_trace(MakeTempDir(), o);
    EXPECT_EQ(s.code(), spyglass::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(c.key), std::string::npos) << s.message();
  }
  prof::TraceOptions mode_alone;
  mode_alone.profiler_options.advanced_configuration.emplace("spyglass_cpu_sample_mode", "cpu");
  auto s = prof::start_trace(MakeTempDir(), mode_alone);
  EXPECT_NE(s.message().find("spyglass_cpu_sample_hz"), std::string::npos) << s.message();
  // An unknown key's message lists what the tracers registered.
  prof::TraceOptions unknown;
  unknown.profiler_options.advanced_configuration.emplace("spyglass_cpu_sample_hzz", int64_t{1});
  s = prof::start_trace(MakeTempDir(), unknown);
  EXPECT_NE(s.message().find("spyglass_cpu_sample_hz,"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("gpu_pm_sample_counters"), std::string::npos) << s.message();
}

TEST(CpuSampler, ZeroIsOff) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(prof::start_trace(dir, Sampling(0)).ok());
  SamplerTestBurn(20'000'000);
  ASSERT_TRUE(prof::stop_trace().ok());
  auto space = ReadXSpace(prof::last_trace_files().xplane_path);
  for (const auto& l : FindPlane(space, "/host:CPU")->lines()) EXPECT_NE(l.name(), "CPU samples");
}

// XLA merges a plugin's host plane into its /host:CPU by event name: only the
// metadata of events is copied (a sample's innermost node), under new ids,
// with the plane's stats. The stack table keeps the stacks readable then.
TEST(CpuModel, StacksSurviveAMergeByEventName) {
  namespace model = spyglass::model;
  namespace sampling = spyglass::sampling;
  model::Plane ours;
  auto node = [&](const std::string& name, const std::string& fn, const std::string& file, uint32_t parent) {
    uint32_t id = ours.intern_event(name);
    std::vector<model::Stat> stats = {ours.ref_stat(sampling::kCpuFrameStat, fn), ours.ref_stat(sampling::kCpuFileStat, file),
                                      ours.int_stat(sampling::kCpuLineStat, 7)};
    if (parent != 0) stats.push_back(ours.uint_stat(sampling::kCpuParentStat, parent));
    stats.push_back(ours.ref_stat(sampling::kCpuFrameKindStat, parent == 0 ? "native" : "python"));
    ours.event_metadata_at(id).display_name = fn;
    ours.event_metadata_at(id).stats = std::move(stats);
    return id;
  };
  ours.intern_event("an annotation");  // ids of ours and the merged plane differ
  uint32_t root = node("cpu_stack#0", "main", "main.cc", 0);
  uint32_t mid = node("cpu_stack#1", "run\twith a tab", "prog.py", root);
  uint32_t leaf = node("cpu_stack#2", "burn", "prog.py", mid);
  ASSERT_EQ(sampling::StackOfNode(ours, leaf).size(), 3u);
  sampling::MakeCpuStacksPortable(&ours);
  for (const auto& md : ours.event_metadata())
    for (const model::Stat& s : md.stats) EXPECT_NE(ours.stat_name(s), sampling::kCpuParentStat);

  // The merge: XLA's plane has metadata of its own first; only the sample's
  // leaf is copied (by name, with its stats), and the plane's stats.
  model::Plane xla;
  xla.intern_event("PjitFunction(f)");
  xla.intern_event("ThunkExecutor::Execute");
  uint32_t copied = xla.intern_event("cpu_stack#2");
  xla.event_metadata_at(copied).display_name = "burn";
  for (const model::Stat& s : ours.stats)
    if (ours.stat_name(s) == sampling::kCpuStackTableStat)
      xla.stats.push_back(xla.str_stat(sampling::kCpuStackTableStat, std::string(ours.stat_str(s))));
  std::vector<sampling::ModelFrame> frames = sampling::StackOfNode(xla, copied);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].function, "burn");
  EXPECT_EQ(frames[1].function, "run with a tab");  // a tab in a name cannot break a row
  EXPECT_TRUE(frames[1].python);
  EXPECT_EQ(frames[1].file, "prog.py");
  EXPECT_EQ(frames[1].line, 7);
  EXPECT_EQ(frames[2].function, "main");
  EXPECT_FALSE(frames[2].python);
  // Asked again (the parsed table is kept for the plane), the same answer.
  EXPECT_EQ(sampling::StackOfNode(xla, copied).size(), 3u);
}

}  // namespace

// Two processes' samples merged into one model (a subprocess's or another
// host's profile, server/merge.h): each plane keeps its own stack nodes
// (ids are per plane, parents point into the same plane), so every sample
// reads back its own process's stack, and its time moves to the parent's
// time base with the other lines.
TEST(CpuModelMerge, MergedPlanesKeepTheirStacksAndTimes) {
  namespace model = spyglass::model;
  namespace smp = spyglass::sampling;
  auto child = [](int64_t pid, const std::vector<std::string>& stack, uint64_t start_ns) {
    model::Space s;
    model::Plane& env = s.plane(model::kTaskEnvPlaneName);
    env.stats.push_back(env.uint_stat(model::kProfileStartTimeStat, start_ns));
    model::Plane& host = s.plane(model::kHostPlaneName);
    host.stats.push_back(host.int_stat(model::kProcessIdStat, pid));
    // A node nobody samples first, so that the two children's node ids differ.
    if (pid == 2) host.intern_event("unrelated");
    uint32_t parent = 0;
    for (size_t i = 0; i < stack.size(); ++i) {
      uint32_t id = host.intern_event(std::string(smp::kCpuStackNodePrefix) + std::to_string(i));
      std::vector<model::Stat> st{host.ref_stat(smp::kCpuFrameStat, stack[i])};
      if (parent) st.push_back(host.uint_stat(smp::kCpuParentStat, parent));
      host.event_metadata_at(id).display_name = stack[i];
      host.event_metadata_at(id).stats = std::move(st);
      parent = id;
    }
    model::Line& l = host.line_with_id(smp::kCpuSampleLineIdBase + pid);
    l.name = std::string(smp::kCpuSamplesLineName);
    l.events.push_back({5'000'000, 1'000'000, parent});  // 5 us after its process's start
    return s;
  };
  model::Space parent;
  const uint64_t start = 1'000'000'000'000;
  spyglass::server::MergeChildSpace(child(1, {"main", "a", "leaf_a"}, start + 1000), start, "1", true, &parent);
  spyglass::server::MergeChildSpace(child(2, {"main", "b", "c", "leaf_c"}, start + 3000), start, "2", true, &parent);
  std::map<std::string, std::string> stacks;
  std::map<std::string, int64_t> times;
  for (const model::Plane& p : parent.planes)
    for (const model::Line& l : p.lines)
      for (const model::Event& e : l.events) {
        std::string s;
        for (const smp::ModelFrame& f : smp::StackOfNode(p, e.metadata_id)) s = std::string(f.function) + (s.empty() ? "" : ">") + s;
        stacks[p.name] = s;
        times[p.name] = l.timestamp_ns * 1000 + e.offset_ps;
      }
  EXPECT_EQ(stacks["/host:CPU [1]"], "main>a>leaf_a");
  EXPECT_EQ(stacks["/host:CPU [2]"], "main>b>c>leaf_c");
  EXPECT_EQ(times["/host:CPU [1]"], 1'000'000 + 5'000'000);  // ps from the parent's start
  EXPECT_EQ(times["/host:CPU [2]"], 3'000'000 + 5'000'000);
}

// Off-CPU Python frames: a blocked thread may wake and free its code objects
// between the reader's "still blocked" check and its reads, so the reader
// reads them through copies only. Fake objects in CPython's layouts (the
// offsets are found at Enable; any will do here).
namespace copied {

using spyglass::sampling::CodeLayout;
using spyglass::sampling::CodeText;
using spyglass::sampling::CopyOwnMemory;
using spyglass::sampling::ReadCodeCopied;

const char kCodeType = 0, kStrType = 0, kBytesType = 0;  // only their addresses matter

long Copy(void* dst, uint64_t src, size_t n) { return CopyOwnMemory(dst, src, n); }

CodeLayout Layout(bool table_310) {
  CodeLayout L;
  L.code_type = &kCodeType;
  L.str_type = &kStrType;
  L.bytes_type = &kBytesType;
  L.co_name = 48;
  L.co_filename = 56;
  L.co_linetable = 136;
  L.co_firstlineno = 72;
  L.ascii_data = 48;
  L.table_310 = table_310;
  return L;
}

template <typename T>
void Put(void* base, int offset, T v) {
  std::memcpy(static_cast<char*>(base) + offset, &v, sizeof v);
}

struct FakeStr {
  alignas(8) unsigned char b[128] = {};
  explicit FakeStr(const char* text) {
    Put<const void*>(b, 8, &kStrType);
    Put<int64_t>(b, 16, static_cast<int64_t>(strlen(text)));
    Put<uint32_t>(b, 32, (1u << 5) | (1u << 6));  // compact, ASCII
    std::memcpy(b + 48, text, strlen(text));
  }
};

struct FakeCode {
  alignas(8) unsigned char b[256] = {};
  alignas(8) unsigned char table[32 + 256] = {};
  FakeStr name{"forward"}, file{"model.py"};
  FakeCode(int first, const std::vector<uint8_t>& lines) {
    Put<const void*>(b, 8, &kCodeType);
    Put<const void*>(b, 48, name.b);
    Put<const void*>(b, 56, file.b);
    Put<int32_t>(b, 72, first);
    Put<const void*>(b, 136, table);
    Put<const void*>(table, 8, &kBytesType);
    Put<int64_t>(table, 16, static_cast<int64_t>(lines.size()));
    std::memcpy(table + 32, lines.data(), lines.size());
  }
};

// A page that was mapped and is no more.
void* UnmappedPage() {
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  munmap(p, 4096);
  return p;
}

// CPython 3.11's co_linetable and its lines (co_lines()) for a function
// starting at line 302: one-line, short, long forms and a negative delta.
const std::vector<uint8_t> kTable311 = {128, 0,   216, 8,   9,   136, 65,  137, 5,   128, 65,  224, 7,   8,   136, 49,
                                        130, 117, 128, 117, 216, 12,  33,  208, 12,  33,  157, 5,   152, 97,  153, 8,
                                        156, 8,   208, 12,  33,  209, 12,  33,  212, 12,  33,  136, 1,   240, 8,   0,
                                        13,  14,  216, 12,  13,  241, 3,   1,   13,  14,  240, 0,   1,   5,   15};
const std::vector<uint8_t> kTable310 = {8, 1, 8, 2, 18, 1, 2, 4, 2, 1, 4, 255};

}  // namespace copied

TEST(BlockedPythonFrames, CodeObjectsAreReadThroughCopiesWithTheirLines) {
  using namespace copied;
  auto text = std::make_unique<CodeText>();
  FakeCode c311(302, kTable311);
  const CodeLayout L311 = Layout(false);
  const std::map<int, int> lines311 = {{0, 302}, {2, 303}, {10, 303}, {12, 305}, {24, 306},
                                       {72, 306}, {74, 310}, {76, 311}, {78, 310}, {82, 310}};
  for (auto [lasti, line] : lines311) {
    ASSERT_TRUE(ReadCodeCopied(L311, Copy, c311.b, lasti, text.get()));
    EXPECT_EQ(std::string(text->name, text->name_len), "forward");
    EXPECT_EQ(std::string(text->file, text->file_len), "model.py");
    EXPECT_EQ(text->line, line) << "3.11 lasti " << lasti;
  }
  ASSERT_TRUE(ReadCodeCopied(L311, Copy, c311.b, -1, text.get()));
  EXPECT_EQ(text->line, 302);  // before the first instruction: the first line
  FakeCode c310(302, kTable310);
  const std::map<int, int> lines310 = {{0, 303}, {6, 303}, {8, 305}, {16, 306}, {32, 306},
                                       {34, 310}, {36, 311}, {40, 310}};
  for (auto [lasti, line] : lines310) {
    ASSERT_TRUE(ReadCodeCopied(Layout(true), Copy, c310.b, lasti, text.get()));
    EXPECT_EQ(text->line, line) << "3.10 lasti " << lasti;
  }
}

TEST(BlockedPythonFrames, FreedCodeObjectsReadAsUnknownNeverAFault) {
  using namespace copied;
  auto text = std::make_unique<CodeText>();
  const CodeLayout L = Layout(false);
  void* gone = UnmappedPage();
  // The code object itself freed and unmapped.
  EXPECT_FALSE(ReadCodeCopied(L, Copy, gone, 4, text.get()));
  EXPECT_FALSE(ReadCodeCopied(L, Copy, static_cast<char*>(gone) + 4000, 4, text.get()));  // and across the end
  // Its name, its file freed.
  FakeCode c(302, kTable311);
  Put<const void*>(c.b, 48, gone);
  EXPECT_FALSE(ReadCodeCopied(L, Copy, c.b, 4, text.get()));
  FakeCode d(302, kTable311);
  Put<const void*>(d.b, 56, static_cast<char*>(gone) + 64);
  EXPECT_FALSE(ReadCodeCopied(L, Copy, d.b, 4, text.get()));
  // A name whose characters are freed (a compact non-ASCII str's utf8 pointer).
  FakeCode e(302, kTable311);
  Put<uint32_t>(e.name.b, 32, 1u << 5);
  Put<int64_t>(e.name.b, 48, 12);
  Put<const void*>(e.name.b, 56, gone);
  EXPECT_FALSE(ReadCodeCopied(L, Copy, e.b, 4, text.get()));
  // Memory reused for something else: not a code object, not a str.
  FakeCode f(302, kTable311);
  Put<const void*>(f.b, 8, &kStrType);
  EXPECT_FALSE(ReadCodeCopied(L, Copy, f.b, 4, text.get()));
  FakeCode g(302, kTable311);
  Put<const void*>(g.file.b, 8, &kCodeType);
  EXPECT_FALSE(ReadCodeCopied(L, Copy, g.b, 4, text.get()));
  // Its line table freed: the name and file, no line.
  FakeCode h(302, kTable311);
  Put<const void*>(h.b, 136, gone);
  ASSERT_TRUE(ReadCodeCopied(L, Copy, h.b, 4, text.get()));
  EXPECT_EQ(std::string(text->name, text->name_len), "forward");
  EXPECT_EQ(text->line, -1);
  // A huge line table (garbage, or a huge function) is cut: the lines in what was copied, else none.
  FakeCode t(302, kTable311);
  Put<int64_t>(t.table, 16, int64_t{1} << 40);
  if (ReadCodeCopied(L, Copy, t.b, 4, text.get())) EXPECT_TRUE(text->table_cut);
  // A huge length (garbage) is cut, not followed.
  FakeCode k(302, kTable311);
  Put<int64_t>(k.name.b, 16, int64_t{1} << 40);
  if (ReadCodeCopied(L, Copy, k.b, 4, text.get())) EXPECT_LE(text->name_len, CodeText::kMaxName);
}
