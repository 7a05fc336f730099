// The GPU tracer without a GPU: option ranges, the libcupti search and its
// message, a session on a machine with no NVIDIA driver (host trace on, an
// XSpace warning, stderr quiet unless a GPU key was set, a start error with
// raise_error_on_start_failure), the pip libcupti loaded with no driver, and
// the driver-API callback's sink (threads, sessions, nothing allocated on the
// launching thread).
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpu/cupti_abi.h"
#include "gpu/cupti_loader.h"
#include "gpu/gpu_callback.h"
#include "gpu/gpu_convert.h"
#include "model/schema.h"
#include "gpu/gpu_options.h"
#include "session_stderr.h"
#include "session/session.h"
#include "spyglass/annotation.h"

namespace spyglass {
namespace {

profiler::ProfileOptions With(const std::string& key, profiler::AdvancedValue v) {
  profiler::ProfileOptions o;
  o.advanced_configuration.emplace(key, std::move(v));
  return o;
}

TEST(GpuOptions, EveryGuideKeyAccepted) {
  profiler::ProfileOptions o;
  o.advanced_configuration = {{"gpu_max_callback_api_events", 1000},
                              {"gpu_max_activity_api_events", 0},
                              {"gpu_max_annotation_strings", 100},
                              {"gpu_enable_nvtx_tracking", true},
                              {"gpu_enable_cupti_activity_graph_trace", true},
                              {"gpu_pm_sample_counters", "sm__cycles_active.avg, dram__bytes_read.sum"},
                              {"gpu_pm_sample_interval_us", 500},
                              {"gpu_pm_sample_buffer_size_per_gpu_mb", 64},
                              {"gpu_num_chips_to_profile_per_task", 2},
                              {"gpu_dump_graph_node_mapping", true}};
  EXPECT_TRUE(profiler::ValidateOptions(o).ok()) << profiler::ValidateOptions(o).message();
  gpu::GpuOptions g = gpu::ParseGpuOptions(o);
  EXPECT_TRUE(g.any_gpu_key);
  EXPECT_EQ(g.max_callback_api_events, 1000);
  EXPECT_EQ(g.max_activity_api_events, 0);
  EXPECT_EQ(g.pm_sample_counters, (std::vector<std::string>{"sm__cycles_active.avg", "dram__bytes_read.sum"}));
  EXPECT_EQ(g.num_chips_to_profile_per_task, 2);
  EXPECT_TRUE(g.enable_activity_graph_trace);
  // 0 callback events means no limit (as XLA), bounded by ours.
  EXPECT_EQ(gpu::ParseGpuOptions(With("gpu_max_callback_api_events", 0)).max_callback_api_events,
            gpu::kMaxCallbackEvents);
  EXPECT_FALSE(gpu::ParseGpuOptions(profiler::ProfileOptions{}).any_gpu_key);
}

TEST(GpuOptions, RangesAndTypesRejected) {
  auto message = [](const profiler::ProfileOptions& o) { return profiler::ValidateOptions(o).message(); };
  EXPECT_NE(message(With("gpu_pm_sample_buffer_size_per_gpu_mb", 32)).find("between 64 and 4096, got 32"),
            std::string::npos);
  EXPECT_NE(message(With("gpu_pm_sample_interval_us", 0)).find("'gpu_pm_sample_interval_us' must be between 1"),
            std::string::npos);
  EXPECT_NE(message(With("gpu_max_callback_api_events", int64_t{1} << 40)).find("must be between 0 and"),
            std::string::npos);
  EXPECT_NE(message(With("gpu_max_activity_api_events", -1)).find("must not be negative"), std::string::npos);
  EXPECT_NE(message(With("gpu_enable_nvtx_tracking", 1)).find("takes a bool value"), std::string::npos);
  EXPECT_NE(message(With("gpu_pm_sample_counters", 5)).find("takes a string value"), std::string::npos);
  EXPECT_NE(message(With("gpu_pm_sample_counters", "sm__x;rm -rf")).find("is not a metric name"), std::string::npos);
  std::string unknown = message(With("gpu_enable_everything", true));
  EXPECT_NE(unknown.find("unknown advanced_configuration key 'gpu_enable_everything'"), std::string::npos) << unknown;
}

TEST(CuptiLoader, NotFoundListsEveryPlaceAndTheFix) {
  setenv("SPYGLASS_CUPTI_PATH", "/nonexistent/cupti", 1);
  setenv("CUDA_HOME", "/opt/cuda-test", 1);
  setenv("VIRTUAL_ENV", "/nonexistent/venv", 1);
  setenv("LD_LIBRARY_PATH", "/nonexistent/ld", 1);
  gpu::Loaded l = gpu::LoadCupti();
  unsetenv("SPYGLASS_CUPTI_PATH");
  unsetenv("CUDA_HOME");
  unsetenv("VIRTUAL_ENV");
  ASSERT_EQ(l.handle, nullptr) << "a libcupti was found at " << l.path;
  EXPECT_NE(l.error.find("libcupti not found. Searched:"), std::string::npos) << l.error;
  EXPECT_NE(l.error.find("/nonexistent/cupti (absent)"), std::string::npos) << l.error;
  EXPECT_NE(l.error.find("LD_LIBRARY_PATH=/nonexistent/ld"), std::string::npos) << l.error;
  EXPECT_NE(l.error.find("/opt/cuda-test/extras/CUPTI/lib64/libcupti.so.13 (absent)"), std::string::npos) << l.error;
  EXPECT_NE(l.error.find("/usr/local/cuda/extras/CUPTI/lib64/"), std::string::npos) << l.error;
  EXPECT_NE(l.error.find("pip install nvidia-cuda-cupti"), std::string::npos) << l.error;
}

TEST(CuptiLoader, WheelsOfTheRunningPythonAreSearched) {
  // The site-packages of a Python that loaded us (here: named by VIRTUAL_ENV).
  char dir[] = "/tmp/spyglass_venv_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string sp = std::string(dir) + "/lib/python3.11/site-packages";
  ASSERT_EQ(std::system(("mkdir -p " + sp).c_str()), 0);
  setenv("VIRTUAL_ENV", dir, 1);
  std::vector<std::string> c = gpu::CuptiCandidates();
  unsetenv("VIRTUAL_ENV");
  bool cu13 = false, cu12 = false;
  for (const std::string& p : c) {
    cu13 |= p == sp + "/nvidia/cu13/lib/libcupti.so.13";
    cu12 |= p == sp + "/nvidia/cuda_cupti/lib/libcupti.so.12";
  }
  EXPECT_TRUE(cu13 && cu12);
  (void)std::system((std::string("rm -rf ") + dir).c_str());
}

bool HasDriver() {
  std::string e;
  return gpu::LoadDriver(&e) != nullptr;
}

TEST(GpuTracer, NoDriverHostTraceGoesOnWithAWarning) {
  if (HasDriver()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  profiler::ProfileOptions o;  // device_tracer_level = 1, no GPU key
  model::Space space;
  session::SessionSummary summary;
  std::string err;
  EXPECT_TRUE(testing::RunSessionCapturingStderr(o, &space, &summary, &err, [] {
                profiler::TraceAnnotation a("host_work");
              }).ok());
  EXPECT_EQ(err.find("GPU tracer"), std::string::npos) << "stderr must stay quiet: " << err;
  ASSERT_EQ(space.warnings.size(), 1u);
  EXPECT_NE(space.warnings[0].find("GPU tracer off: no NVIDIA driver (libcuda.so.1"), std::string::npos)
      << space.warnings[0];
  EXPECT_GE(summary.events, 1u);  // the host trace
  EXPECT_EQ(space.find_plane("/device:GPU:0"), nullptr);
}

// Another profiler of the process traces the device (XLA's in a JAX
// process): ours steps aside before loading anything, and the trace says why.
TEST(GpuTracer, StepsAsideWhereAnotherTracerOwnsTheDevice) {
  gpu::SetDeviceOwnerProbe([](const profiler::ProfileOptions&) { return std::string("XLA's device tracer (test)"); });
  profiler::ProfileOptions o;  // device_tracer_level = 1
  model::Space space;
  session::SessionSummary summary;
  std::string err;
  Status s = testing::RunSessionCapturingStderr(o, &space, &summary, &err, [] {
    profiler::TraceAnnotation a("host_work");
  });
  gpu::SetDeviceOwnerProbe(nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(space.warnings.size(), 1u);
  EXPECT_NE(space.warnings[0].find("GPU tracer off: XLA's device tracer (test) traces the device in this process"),
            std::string::npos)
      << space.warnings[0];
  EXPECT_FALSE(gpu::GpuTracerActive());
  EXPECT_GE(summary.events, 1u);  // the host trace goes on
  // A probe naming nobody: the GPU tracer is ours again (here: no driver, or a GPU).
  gpu::SetDeviceOwnerProbe([](const profiler::ProfileOptions&) { return std::string(); });
  model::Space again;
  ASSERT_TRUE(testing::RunSessionCapturingStderr(o, &again, &summary, &err, [] {}).ok());
  gpu::SetDeviceOwnerProbe(nullptr);
  for (const std::string& w : again.warnings) EXPECT_EQ(w.find("traces the device in this process"), std::string::npos) << w;
}

TEST(GpuTracer, NoDriverWithAGpuKeySaysSoOnStderrOnce) {
  if (HasDriver()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  profiler::ProfileOptions o = With("gpu_max_activity_api_events", 1000);
  model::Space space;
  session::SessionSummary summary;
  std::string err;
  (void)testing::RunSessionCapturingStderr(o, &space, &summary, &err);
  EXPECT_EQ(err, err.substr(0, err.find('\n') + 1)) << "one line: " << err;
  EXPECT_EQ(err.rfind("spyglass: GPU tracer off: no NVIDIA driver", 0), 0u) << err;
}

TEST(GpuTracer, RaiseErrorOnStartFailure) {
  if (HasDriver()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  profiler::ProfileOptions o;
  o.raise_error_on_start_failure = true;
  std::unique_ptr<session::Session> s;
  Status st = session::Session::Create(o, "busy", &s);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("GPU tracer off: no NVIDIA driver"), std::string::npos) << st.message();
  EXPECT_EQ(s, nullptr);
  // device_tracer_level=0: no GPU tracer, no error.
  o.device_tracer_level = 0;
  ASSERT_TRUE(session::Session::Create(o, "busy", &s).ok());
  s.reset();
}

// The pip wheel's libcupti on this driverless machine: it loads (our loader
// finds it by SPYGLASS_CUPTI_PATH), and the session still reports the missing
// driver, which is checked first, rather than failing inside CUPTI.
TEST(GpuTracer, PipLibcuptiWithoutDriver) {
  const char* dir = std::getenv("SPYGLASS_TEST_CUPTI_DIR");
  if (dir == nullptr || *dir == 0) GTEST_SKIP() << "SPYGLASS_TEST_CUPTI_DIR not set (pip nvidia-cuda-cupti)";
  if (access((std::string(dir) + "/libcupti.so.13").c_str(), R_OK) != 0)
    GTEST_SKIP() << "no pip libcupti in " << dir << " (scripts/setup.sh --browser installs it)";
  if (HasDriver()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  setenv("SPYGLASS_CUPTI_PATH", dir, 1);
  gpu::Loaded l = gpu::LoadCupti();
  ASSERT_NE(l.handle, nullptr) << l.error;
  using GetTimestamp = int (*)(uint64_t*);
  auto ts = reinterpret_cast<GetTimestamp>(dlsym(l.handle, "cuptiGetTimestamp"));
  ASSERT_NE(ts, nullptr);
  profiler::ProfileOptions o;
  o.raise_error_on_start_failure = true;
  std::unique_ptr<session::Session> s;
  Status st = session::Session::Create(o, "busy", &s);
  unsetenv("SPYGLASS_CUPTI_PATH");
  EXPECT_NE(st.message().find("no NVIDIA driver"), std::string::npos) << st.message();
}

TEST(ClockMap, OffsetAtStartAndDriftFromSamples) {
  // CUPTI's clock runs 100 ppm fast and starts 5 s ahead of the host's.
  gpu::ClockMap c;
  const uint64_t c0 = 5'000'000'000;
  for (int i = 0; i <= 10; ++i) {
    int64_t host = int64_t{i} * 1'000'000'000;  // a sample a second
    c.AddSample(c0 + static_cast<uint64_t>(host + host / 10000), host - 200, host + 200);
  }
  EXPECT_EQ(c.bound_ns(), 200);
  // 7.5 s into the session: without drift correction the error would be 750 us.
  int64_t at = 7'500'000'000;
  int64_t ps = c.ToPs(c0 + static_cast<uint64_t>(at + at / 10000));
  EXPECT_NEAR(static_cast<double>(ps), static_cast<double>(at) * 1000, 1000.0);  // within 1 ns
}

// A cap on device records drops the rest, counts them per GPU and says so.
// The driver-API callback's sink hands slots to threads in blocks: several
// threads launching at once keep every call up to the cap or count it as
// dropped, each call once; a new session's array is never written through a
// block of the last one.
std::atomic<uint64_t> g_fake_clock{1000};
int FakeTimestamp(uint64_t* t) {
  *t = g_fake_clock.fetch_add(1);
  return 0;
}
int FakeDevice(void*, uint32_t* device) {
  *device = 0;
  return 0;
}
// Allocations made on this thread while counting (this test binary's malloc
// and calloc count, then hand over to glibc's).
std::atomic<bool> g_counting{false};
thread_local uint64_t t_allocations = 0;
}  // namespace
}  // namespace spyglass
// (Not under a sanitizer: its own malloc must stay in place.)
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define SPYGLASS_COUNTING_MALLOC 1
extern "C" void* __libc_malloc(size_t);
extern "C" void* __libc_calloc(size_t, size_t);
extern "C" void* malloc(size_t n) {
  if (spyglass::g_counting.load(std::memory_order_relaxed)) ++spyglass::t_allocations;
  return __libc_malloc(n);
}
extern "C" void* calloc(size_t n, size_t m) {
  if (spyglass::g_counting.load(std::memory_order_relaxed)) ++spyglass::t_allocations;
  return __libc_calloc(n, m);
}
#endif
namespace spyglass {
namespace {

void Launch(gpu::CallbackSink* sink, uint32_t correlation) {
  namespace cb = gpu::abi::cbdata;
  alignas(8) uint8_t data[cb::kSize] = {};
  static int context;
  const char* name = "cuLaunchKernel";
  void* ctx = &context;
  uint64_t start = 0;
  uint64_t* slot = &start;
  std::memcpy(data + cb::kFunctionName, &name, sizeof name);
  std::memcpy(data + cb::kContext, &ctx, sizeof ctx);
  std::memcpy(data + cb::kCorrelationData, &slot, sizeof slot);
  std::memcpy(data + cb::kCorrelationId, &correlation, sizeof correlation);
  for (int site : {gpu::abi::kApiEnter, gpu::abi::kApiExit}) {
    std::memcpy(data + cb::kCallbackSite, &site, sizeof site);
    gpu::ApiCallback(sink, gpu::abi::kDomainDriverApi, gpu::abi::cbid::kLaunchKernel, data);
  }
}

// A sink of `n` slots with the fakes above (launches only: no memory tracked).
void Prepare(gpu::CallbackSink* sink, uint64_t n) {
  sink->get_timestamp = FakeTimestamp;
  sink->get_device_id = FakeDevice;
  sink->track_memory = false;
  ASSERT_TRUE(sink->Reserve(n));
}

TEST(CallbackSink, ThreadsKeepOrCountEveryCallAcrossSessions) {
  gpu::CallbackSink sink;
  Prepare(&sink, 1000);
  constexpr uint32_t kThreads = 4, kCalls = 300;  // 1200 calls for 1000 slots
  Launch(&sink, 1'000'000);                          // this thread holds a block too
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < kThreads; ++t)
    threads.emplace_back([&sink, t] {
      for (uint32_t i = 0; i < kCalls; ++i) Launch(&sink, t * kCalls + i + 1);
    });
  for (std::thread& t : threads) t.join();
  const uint64_t kept = sink.recorded(), dropped = sink.dropped[0].load();
  EXPECT_EQ(kept + dropped, kThreads * kCalls + 1);
  EXPECT_LE(kept, 1000u);
  EXPECT_GE(kept, 1000u - (kThreads + 1) * (gpu::CallbackSink::kBlock - 1));  // at most a part-filled block a thread
  std::set<uint32_t> seen;
  for (uint64_t i = 0; i < sink.size(); ++i) {
    const gpu::ApiEvent& e = sink.events[i];
    if (e.end_ns == 0) continue;
    EXPECT_TRUE(seen.insert(e.correlation_id).second) << "call " << e.correlation_id << " kept twice";
    EXPECT_STREQ(e.function, "cuLaunchKernel");
    EXPECT_GT(e.end_ns, e.start_ns);
  }
  EXPECT_EQ(seen.size(), kept);

  // The next session: this thread's block of the old array is not used.
  ASSERT_TRUE(sink.Reserve(1000));
  for (uint32_t i = 0; i < 10; ++i) Launch(&sink, 2'000'000 + i);
  EXPECT_EQ(sink.recorded(), 10u);
  for (uint32_t i = 0; i < 10; ++i) EXPECT_EQ(sink.events[i].correlation_id, 2'000'000 + i) << i;
}

// The rule for the launching thread: nothing allocated (nor locked:
// the code takes none) by the callback once the thread has its slots.
TEST(CallbackSink, LaunchesAllocateNothingOnTheLaunchingThread) {
#ifndef SPYGLASS_COUNTING_MALLOC
  GTEST_SKIP() << "a sanitizer's malloc: no counting malloc in this build";
#endif
  gpu::CallbackSink sink;
  Prepare(&sink, 100000);
  Launch(&sink, 1);  // the thread's first call: its TLS and first block
  t_allocations = 0;
  g_counting = true;
  for (uint32_t i = 0; i < 10000; ++i) Launch(&sink, i + 2);
  g_counting = false;
  EXPECT_EQ(t_allocations, 0u);
  EXPECT_EQ(sink.recorded(), 10001u);
  // The counter counts: one allocation of ours is seen.
  g_counting = true;
  void* volatile p = std::malloc(16);
  g_counting = false;
  std::free(p);
  EXPECT_EQ(t_allocations, 1u);
}

TEST(GpuCollector, ActivityCapDropsAreCountedPerGpuAndShown) {
  namespace abi = gpu::abi;
  gpu::GpuCollector c(gpu::GpuLimits{3, 0});
  alignas(8) unsigned char rec[208] = {};
  auto put32 = [&](size_t off, uint32_t v) { std::memcpy(rec + off, &v, 4); };
  auto put64 = [&](size_t off, uint64_t v) { std::memcpy(rec + off, &v, 8); };
  put32(0, abi::kind::kMemset);
  put64(abi::memset::kBytes, 64);
  for (uint32_t i = 0; i < 5; ++i) {
    put64(abi::memset::kStart, 1000 + i * 10);
    put64(abi::memset::kEnd, 1005 + i * 10);
    put32(abi::memset::kDeviceId, i % 2);  // GPUs 0,1,0 kept; 1,0 dropped
    put32(abi::memset::kCorrelationId, i + 1);
    c.AddRecord(rec);
  }
  EXPECT_EQ(c.records(), 3u);
  EXPECT_EQ(c.dropped(), 2u);
  gpu::ClockMap clock;
  clock.AddSample(1000, 0, 0);
  model::Space space;
  c.Export(clock, &space);
  ASSERT_EQ(space.warnings.size(), 1u);
  EXPECT_NE(space.warnings[0].find("GPU 0: 1 events dropped because total device(activity) events reaches max"),
            std::string::npos) << space.warnings[0];
  EXPECT_NE(space.warnings[0].find("GPU 1: 1 events dropped"), std::string::npos) << space.warnings[0];
  for (const char* name : {"/device:GPU:0", "/device:GPU:1"}) {
    const model::Plane* p = space.find_plane(name);
    ASSERT_NE(p, nullptr) << name;
    bool stat = false;
    for (const model::Stat& s : p->stats) stat |= p->stat_name(s) == model::kDroppedEventsStat && s.u64 == 1;
    EXPECT_TRUE(stat) << name;
  }
  EXPECT_EQ(space.find_plane("/device:GPU:0")->lines.at(0).events.size(), 2u);
}

// A corrupt buffer naming a new stream in every record: the streams kept
// per GPU are bounded, the rest counted and said.
TEST(GpuCollector, StreamsPerGpuAreBounded) {
  namespace abi = gpu::abi;
  gpu::GpuCollector c(gpu::GpuLimits{1u << 30, 0});
  alignas(8) unsigned char rec[208] = {};
  auto put32 = [&](size_t off, uint32_t v) { std::memcpy(rec + off, &v, 4); };
  auto put64 = [&](size_t off, uint64_t v) { std::memcpy(rec + off, &v, 8); };
  put32(0, abi::kind::kMemset);
  put64(abi::memset::kStart, 1000);
  put64(abi::memset::kEnd, 1001);
  const uint32_t n = 20000;
  for (uint32_t i = 0; i < n; ++i) {
    put32(abi::memset::kStreamId, i);
    c.AddRecord(rec);
  }
  EXPECT_EQ(c.records(), 16384u);
  EXPECT_EQ(c.dropped(), n - 16384u);
  gpu::ClockMap clock;
  clock.AddSample(1000, 0, 0);
  model::Space space;
  c.Export(clock, &space);
  ASSERT_EQ(space.warnings.size(), 1u);
  EXPECT_NE(space.warnings[0].find("3616 events dropped because over 16384 streams on the GPU"), std::string::npos)
      << space.warnings[0];
  EXPECT_EQ(space.find_plane("/device:GPU:0")->lines.size(), 16384u);
}

// Kernel names are copied as records arrive: CUPTI's strings may be gone by
// the time the session stops.
TEST(GpuCollector, KernelNamesAreCopiedWhenAdded) {
  namespace abi = gpu::abi;
  gpu::GpuCollector c(gpu::GpuLimits{}, /*copy_names=*/true);
  alignas(8) unsigned char rec[208] = {};
  char name[] = "_Z6kernelv";
  const char* ptr = name;
  uint32_t kind = abi::kind::kConcurrentKernel;
  uint64_t start = 1000, end = 2000;
  std::memcpy(rec, &kind, 4);
  std::memcpy(rec + abi::kernel::kStart, &start, 8);
  std::memcpy(rec + abi::kernel::kEnd, &end, 8);
  std::memcpy(rec + abi::kernel::kName, &ptr, sizeof ptr);
  c.AddRecord(rec);
  std::memset(name, 'x', sizeof name - 1);  // CUPTI reused the memory
  gpu::ClockMap clock;
  clock.AddSample(1000, 0, 0);
  model::Space space;
  c.Export(clock, &space);
  const model::Plane* p = space.find_plane("/device:GPU:0");
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->lines.size(), 1u);
  EXPECT_EQ(p->event_metadata()[p->lines[0].events.at(0).metadata_id].name, "kernel()");
}

}  // namespace
}  // namespace spyglass
