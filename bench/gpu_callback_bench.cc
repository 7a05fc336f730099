// Host cost of a traced CUDA launch on the launching thread, as far as it is
// ours: the driver-API callback (src/gpu/gpu_callback.cc) at the call's entry
// and exit, fed CUpti_CallbackData laid out as CUPTI passes it (offsets of
// src/gpu/cupti_abi.h), with a stand-in for cuptiGetTimestamp
// (CLOCK_MONOTONIC through the vDSO). The record goes into the preallocated
// sink, as in a session.
//
// Same-run baselines: the floor (the two timestamp reads a timed call needs,
// nothing kept) and a naive tracer (the same reads, a mutex and a
// std::vector push per call). One and two launching threads (the sink's
// slot counter is the one shared write). What CUPTI adds per launch (its
// activity records, its callback dispatch) needs a GPU: scripts/gpu_check.sh
// measures the whole launch there.
#include <benchmark/benchmark.h>

#include <time.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "gpu/cupti_abi.h"
#include "gpu/gpu_callback.h"

namespace {

using namespace spyglass;
namespace abi = gpu::abi;
namespace cb = abi::cbdata;

constexpr uint64_t kCapacity = 1 << 20;

int Timestamp(uint64_t* t) {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  *t = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  return 0;
}
int DeviceZero(void*, uint32_t* device) {
  *device = 0;
  return 0;
}

// A cuLaunchKernel's CUpti_CallbackData, at entry or exit.
struct LaunchData {
  alignas(8) uint8_t bytes[cb::kSize] = {};
  uint64_t correlation_data = 0;
  LaunchData(int site, uint32_t correlation) {
    static int context;
    const char* name = "cuLaunchKernel";
    void* ctx = &context;
    uint64_t* slot = &correlation_data;
    std::memcpy(bytes + cb::kCallbackSite, &site, sizeof site);
    std::memcpy(bytes + cb::kFunctionName, &name, sizeof name);
    std::memcpy(bytes + cb::kContext, &ctx, sizeof ctx);
    std::memcpy(bytes + cb::kCorrelationData, &slot, sizeof slot);
    std::memcpy(bytes + cb::kCorrelationId, &correlation, sizeof correlation);
  }
};

gpu::CallbackSink& Sink() {
  static gpu::CallbackSink* sink = [] {
    auto* s = new gpu::CallbackSink;
    s->get_timestamp = Timestamp;
    s->get_device_id = DeviceZero;
    s->track_memory = false;
    s->Reserve(kCapacity);
    for (uint64_t i = 0; i < kCapacity; ++i) s->events[i] = {};  // committed before timing
    return s;
  }();
  return *sink;
}

// The floor: the two timestamp reads of a timed call.
void BM_Floor_TwoTimestamps(benchmark::State& state) {
  for (auto _ : state) {
    uint64_t a, b;
    Timestamp(&a);
    Timestamp(&b);
    benchmark::DoNotOptimize(a);
    benchmark::DoNotOptimize(b);
  }
  state.SetItemsProcessed(state.iterations());
}

// Naive: the same reads, then a mutex-guarded push into a growing vector.
void BM_Naive_MutexVector(benchmark::State& state) {
  static std::mutex mu;
  static std::vector<gpu::ApiEvent> events;
  for (auto _ : state) {
    gpu::ApiEvent e;
    Timestamp(&e.start_ns);
    Timestamp(&e.end_ns);
    e.function = "cuLaunchKernel";
    e.cbid = abi::cbid::kLaunchKernel;
    std::lock_guard<std::mutex> lock(mu);
    if (events.size() == kCapacity) events.clear();
    events.push_back(e);
  }
  state.SetItemsProcessed(state.iterations());
}

// Ours: the callback at the launch's entry and exit.
void BM_Ours_LaunchCallback(benchmark::State& state) {
  gpu::CallbackSink& sink = Sink();
  LaunchData enter(abi::kApiEnter, 1), exit(abi::kApiExit, 1);
  std::memcpy(exit.bytes + cb::kCorrelationData, enter.bytes + cb::kCorrelationData, sizeof(void*));
  for (auto _ : state) {
    gpu::ApiCallback(&sink, abi::kDomainDriverApi, abi::cbid::kLaunchKernel, enter.bytes);
    gpu::ApiCallback(&sink, abi::kDomainDriverApi, abi::cbid::kLaunchKernel, exit.bytes);
    // Kept in steady state: the sink wraps instead of counting drops.
    if (sink.next.load(std::memory_order_relaxed) >= kCapacity - 64) sink.next.store(0, std::memory_order_relaxed);
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_Floor_TwoTimestamps)->Threads(1)->Threads(2);
BENCHMARK(BM_Naive_MutexVector)->Threads(1)->Threads(2);
BENCHMARK(BM_Ours_LaunchCallback)->Threads(1)->Threads(2);

}  // namespace

BENCHMARK_MAIN();
