// PM sampling (gpu_pm_sample_counters) without a GPU: the decode-to-model
// step on synthetic decoded samples, the whole CUPTI call sequence against a
// fake CUPTI (what is asked for, what is decoded, what is torn down), the
// failure messages, the symbol names against the pip libcupti, and a session
// on this driverless machine.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "export/trace_json/trace_json_writer.h"
#include "gpu/cupti_abi.h"
#include "gpu/cupti_loader.h"
#include "gpu/pm_sampling.h"
#include "session_stderr.h"
#include "model/schema.h"
#include "session/session.h"

namespace spyglass {
namespace {

namespace pm = gpu::abi::pm;

gpu::ClockMap Clock() {
  gpu::ClockMap c;  // CUPTI ns 1e9 is the session's start
  c.AddSample(1'000'000'000, 0, 0);
  c.AddSample(2'000'000'000, 1'000'000'000, 1'000'000'000);
  return c;
}

TEST(PmCounters, DecodedSamplesBecomeACounterLinePerGpu) {
  std::vector<std::string> metrics = {"sm__cycles_active.avg", "dram__throughput.avg.pct_of_peak_sustained_elapsed"};
  gpu::PmDeviceSamples g1;
  g1.device = 1;
  for (int i = 0; i < 3; ++i) {
    g1.start_ns.push_back(1'000'000'000 + i * 500'000);
    g1.end_ns.push_back(1'000'500'000 + i * 500'000);
    g1.values.push_back(10.0 * i);
    g1.values.push_back(0.5 + i);
  }
  g1.overflows = 1;
  model::Space space;
  gpu::AddPmCounters(metrics, {g1}, Clock(), &space);
  EXPECT_EQ(space.find_plane("/device:GPU:0"), nullptr);
  const model::Plane* p = space.find_plane("/device:GPU:1");
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->lines.size(), 1u);
  const model::Line& l = p->lines[0];
  EXPECT_EQ(l.name, model::kCounterLineName);
  ASSERT_EQ(l.events.size(), 6u);
  // Sample i at its end: 500 us * (i + 1); both metrics, value in a double stat named after the metric.
  for (size_t j = 0; j < l.events.size(); ++j) {
    const model::Event& e = l.events[j];
    const std::string& name = p->event_metadata()[e.metadata_id].name;
    ASSERT_EQ(l.stats_of(e).size(), 1u);
    const model::Stat& s = l.stats_of(e)[0];
    EXPECT_EQ(p->stat_name(s), name);
    EXPECT_EQ(s.kind, model::StatKind::kDouble);
    int i = static_cast<int>(e.offset_ps / 500'000'000) - 1;
    EXPECT_EQ(e.offset_ps, int64_t{500'000'000} * (i + 1));
    EXPECT_EQ(e.duration_ps, 0);
    EXPECT_DOUBLE_EQ(s.f64, name == metrics[0] ? 10.0 * i : 0.5 + i) << name << " " << i;
  }
  ASSERT_EQ(space.warnings.size(), 1u);
  EXPECT_NE(space.warnings[0].find("GPU 1: PM sampling lost samples"), std::string::npos) << space.warnings[0];
  // Our trace JSON shows them as counter tracks.
  std::string json = exporter::TraceJsonString(space);
  EXPECT_NE(json.find("\"ph\":\"C\""), std::string::npos);
  EXPECT_NE(json.find("sm__cycles_active.avg"), std::string::npos);
}

// A fake CUPTI: records what it was asked, hands out 3 samples per decode.
// Calls that can fail, in order: 0 ProfilerInitialize, 1 DeviceGetChipName,
// 2-3 GetCounterAvailability, 4 HostInitialize, 5 HostConfigAddMetrics,
// 6 HostGetConfigImageSize, 7 HostGetConfigImage, 8 Enable, 9 SetConfig,
// 10 GetCounterDataSize, 11 Start.
struct Fake {
  int fail_at = -1;  // index of the call (order below) that fails
  int fail_with = 0;
  int calls = 0;
  uint64_t interval = 0;
  size_t buffer = 0, set_config_size = 0;
  int trigger = -1;
  int host_objects = 0, samplers = 0, initialized = 0, started = 0, decodes = 0;
  std::vector<std::string> metrics;
} g_fake;
char g_host_obj, g_sampler_obj;

int Step() { return g_fake.calls++ == g_fake.fail_at ? g_fake.fail_with : 0; }

gpu::PmApi FakeApi() {
  gpu::PmApi a{};
  a.ProfilerInitialize = [](void*) { return Step() ? g_fake.fail_with : (++g_fake.initialized, 0); };
  a.ProfilerDeInitialize = [](void*) { return --g_fake.initialized, 0; };
  a.DeviceGetChipName = [](void* v) {
    static_cast<pm::DeviceGetChipNameParams*>(v)->pChipName = "GH100";
    return Step();
  };
  a.GetCounterAvailability = [](void* v) {
    static_cast<pm::GetCounterAvailabilityParams*>(v)->counterAvailabilityImageSize = 64;
    return Step();
  };
  a.HostInitialize = [](void* v) {
    if (int r = Step()) return r;
    auto* p = static_cast<pm::HostInitializeParams*>(v);
    if (p->profilerType != pm::kProfilerTypePmSampling || std::string(p->pChipName) != "GH100") return 1;
    p->pHostObject = &g_host_obj;
    ++g_fake.host_objects;
    return 0;
  };
  a.HostDeinitialize = [](void*) { return --g_fake.host_objects, 0; };
  a.HostConfigAddMetrics = [](void* v) {
    auto* p = static_cast<pm::HostConfigAddMetricsParams*>(v);
    for (size_t i = 0; i < p->numMetrics; ++i) g_fake.metrics.push_back(p->ppMetricNames[i]);
    return Step();
  };
  a.HostGetConfigImageSize = [](void* v) {
    static_cast<pm::HostGetConfigImageSizeParams*>(v)->configImageSize = 128;
    return Step();
  };
  a.HostGetConfigImage = [](void*) { return Step(); };
  a.Enable = [](void* v) {
    if (int r = Step()) return r;
    static_cast<pm::EnableParams*>(v)->pPmSamplingObject = &g_sampler_obj;
    ++g_fake.samplers;
    return 0;
  };
  a.Disable = [](void*) { return --g_fake.samplers, 0; };
  a.SetConfig = [](void* v) {
    auto* p = static_cast<pm::SetConfigParams*>(v);
    g_fake.interval = p->samplingInterval;
    g_fake.buffer = p->hardwareBufferSize;
    g_fake.trigger = p->triggerMode;
    g_fake.set_config_size = p->structSize;
    return Step();
  };
  a.GetCounterDataSize = [](void* v) {
    static_cast<pm::GetCounterDataSizeParams*>(v)->counterDataSize = 4096;
    return Step();
  };
  a.CounterDataImageInitialize = [](void*) { return 0; };
  a.Start = [](void*) { return Step() ? g_fake.fail_with : (++g_fake.started, 0); };
  a.Stop = [](void*) { return --g_fake.started, 0; };
  a.DecodeData = [](void* v) {
    static_cast<pm::DecodeDataParams*>(v)->decodeStopReason = 2;  // END_OF_RECORDS
    ++g_fake.decodes;
    return 0;
  };
  a.GetCounterDataInfo = [](void* v) {
    static_cast<pm::GetCounterDataInfoParams*>(v)->numCompletedSamples = 3;
    return 0;
  };
  a.GetSampleInfo = [](void* v) {
    auto* p = static_cast<pm::GetSampleInfoParams*>(v);
    p->startTimestamp = 1'000'000'000 + p->sampleIndex * 1000;
    p->endTimestamp = p->startTimestamp + 1000;
    return 0;
  };
  a.HostEvaluateToGpuValues = [](void* v) {
    auto* p = static_cast<pm::HostEvaluateToGpuValuesParams*>(v);
    for (size_t i = 0; i < p->numMetrics; ++i) p->pMetricValues[i] = 100.0 * p->rangeIndex + i;
    return 0;
  };
  return a;
}

TEST(PmSampler, SamplesEachGpuAndTearsEverythingDown) {
  g_fake = {};
  {
    gpu::PmSampler s(FakeApi(), {"a.sum", "b.avg"}, 250, 32 /* clamped to 64 */);
    std::string why;
    ASSERT_TRUE(s.Start({0, 1}, &why)) << why;
    EXPECT_EQ(g_fake.metrics, (std::vector<std::string>{"a.sum", "b.avg", "a.sum", "b.avg"}));
    EXPECT_EQ(g_fake.interval, 250'000u);  // ns
    EXPECT_EQ(g_fake.buffer, size_t{64} << 20);
    EXPECT_EQ(g_fake.trigger, pm::kTriggerGpuTimeInterval);
    EXPECT_EQ(g_fake.set_config_size, offsetof(pm::SetConfigParams, triggerMode) + sizeof(int));
    EXPECT_EQ(g_fake.started, 2);
    s.Stop();
    EXPECT_EQ(g_fake.started, 0);
    EXPECT_EQ(g_fake.samplers, 0);
    EXPECT_EQ(g_fake.host_objects, 0);
    EXPECT_EQ(g_fake.initialized, 0);
    ASSERT_EQ(s.samples().size(), 2u);
    const gpu::PmDeviceSamples& d1 = s.samples()[1];
    EXPECT_EQ(d1.device, 1u);
    // 3 per decode (the thread's, every 100 ms, and the last one at Stop).
    ASSERT_GE(d1.start_ns.size(), 3u);
    EXPECT_EQ(d1.start_ns.size() % 3, 0u);
    EXPECT_EQ(d1.values.size(), d1.start_ns.size() * 2);
    EXPECT_DOUBLE_EQ(d1.values[2 * 2 + 1], 201.0);  // sample 2, metric 1
    EXPECT_EQ(d1.end_ns[1], 1'000'002'000u);
  }
}

TEST(PmSampler, KeptSamplesAreCappedAndTheRestCounted) {
  g_fake = {};
  gpu::PmSampler s(FakeApi(), {"a.sum"}, 500, 64, /*max_samples=*/4);
  std::string why;
  ASSERT_TRUE(s.Start({0}, &why)) << why;
  s.DecodeAll();
  s.DecodeAll();
  s.Stop();
  EXPECT_EQ(s.samples()[0].start_ns.size(), 4u);
  EXPECT_EQ(s.samples()[0].dropped + 4, 3u * static_cast<uint64_t>(g_fake.decodes));
}

TEST(PmSampler, FailuresSayWhyAndLeaveNothingEnabled) {
  struct Case {
    int call, result;
    const char* text;
  } cases[] = {
      {0, gpu::abi::kErrorInsufficientPrivileges, "NVreg_RestrictProfilingToAdminUsers=0"},
      {8, gpu::abi::kErrorInsufficientPrivileges, "GPU 0: PM sampling: cuptiPmSamplingEnable failed"},
      {8, pm::kErrorNotSupported, "cannot sample counters (PM sampling needs a Turing or newer GPU"},
      {5, pm::kErrorInvalidMetricName, "is not a metric of this GPU"},
      {11, pm::kErrorHardwareBusy, "another profiler holds the counters"},
      {9, pm::kErrorMigNotSupported, "MIG"},
  };
  for (const Case& c : cases) {
    g_fake = {};
    g_fake.fail_at = c.call;
    g_fake.fail_with = c.result;
    gpu::PmSampler s(FakeApi(), {"a.sum"}, 500, 64);
    std::string why;
    EXPECT_FALSE(s.Start({0}, &why));
    EXPECT_NE(why.find(c.text), std::string::npos) << "call " << c.call << ": " << why;
    EXPECT_EQ(g_fake.samplers, 0);
    EXPECT_EQ(g_fake.host_objects, 0);
    EXPECT_EQ(g_fake.initialized, 0);
    EXPECT_EQ(g_fake.started, 0);
  }
}

// The symbol names, against the real libcupti of the pip wheel.
TEST(PmSampler, PipLibcuptiHasEveryFunction) {
  const char* dir = std::getenv("SPYGLASS_TEST_CUPTI_DIR");
  std::string path = std::string(dir ? dir : "") + "/libcupti.so.13";
  if (dir == nullptr || access(path.c_str(), R_OK) != 0) GTEST_SKIP() << "no pip libcupti (SPYGLASS_TEST_CUPTI_DIR)";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  gpu::PmApi api{};
  std::string missing;
  EXPECT_TRUE(gpu::ResolvePmApi(h, &api, &missing)) << missing;
  // And an older CUPTI (here: this program, which has none) is named as such.
  void* self = dlopen(nullptr, RTLD_NOW);
  EXPECT_FALSE(gpu::ResolvePmApi(self, &api, &missing));
  EXPECT_NE(missing.find("cuptiPmSamplingEnable"), std::string::npos) << missing;
}

TEST(PmSampler, NoDriverSessionSaysTheCountersWereNotSampled) {
  std::string e;
  if (gpu::LoadDriver(&e) != nullptr) GTEST_SKIP() << "this machine has an NVIDIA driver";
  profiler::ProfileOptions o;
  o.advanced_configuration.emplace("gpu_pm_sample_counters", "sm__cycles_active.avg");
  model::Space space;
  session::SessionSummary summary;
  std::string err;
  (void)testing::RunSessionCapturingStderr(o, &space, &summary, &err);
  EXPECT_EQ(err.rfind("spyglass: GPU tracer off: no NVIDIA driver", 0), 0u) << err;
  bool said = false;
  for (const std::string& w : space.warnings)
    said |= w.rfind("gpu_pm_sample_counters: not sampled (the GPU tracer is off: no NVIDIA driver", 0) == 0;
  EXPECT_TRUE(said);
}

}  // namespace
}  // namespace spyglass
