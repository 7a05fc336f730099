// Conversion of CUPTI activity records to the model and to .xplane.pb, in
// records per second, from synthetic buffers laid out as CUPTI writes them
// (Kernel9 / Memcpy5 / Memset4 sizes and offsets of src/gpu/cupti_abi.h):
// 60% kernels (20 distinct, one launch configuration each), 30% copies (a few
// sizes), 10% memsets, on 4 streams, with a host launch event per record.
//
// Same-run baselines: the floor (read each record's kind and copy its 216
// bytes: what walking the buffer costs), the parse into our compact events
// (AddRecord), then + the model (Export), then + serializing (.xplane.pb).
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>
#include <vector>

#include "export/xplane/xplane_writer.h"
#include "gpu/cupti_abi.h"
#include "gpu/gpu_convert.h"

namespace {

using namespace spyglass;
namespace abi = gpu::abi;

constexpr size_t kKernelSize = 208, kMemcpySize = 88, kMemsetSize = 88;
const char* const kKernelNames[] = {"_Z6gemm_0PfS_", "_Z6gemm_1PfS_", "_Z6gemm_2PfS_", "_Z6gemm_3PfS_",
                                    "_Z6gemm_4PfS_", "_Z6relu_0Pf",   "_Z6relu_1Pf",   "_Z6relu_2Pf",
                                    "_Z6relu_3Pf",   "_Z6relu_4Pf",   "_Z6norm_0Pf",   "_Z6norm_1Pf",
                                    "_Z6norm_2Pf",   "_Z6norm_3Pf",   "_Z6norm_4Pf",   "_Z6sum_0Pf",
                                    "_Z6sum_1Pf",    "_Z6sum_2Pf",    "_Z6sum_3Pf",    "_Z6sum_4Pf"};

template <class T>
void Put(std::vector<uint8_t>& b, size_t at, size_t off, T v) {
  std::memcpy(b.data() + at + off, &v, sizeof v);
}

struct Synthetic {
  std::vector<uint8_t> buffer;
  std::vector<size_t> offsets;  // of each record (cuptiActivityGetNextRecord's walk)
  std::vector<gpu::ApiEvent> launches;
};

const Synthetic& Make(size_t n) {
  static Synthetic s;
  if (s.offsets.size() == n) return s;
  s = {};
  s.buffer.reserve(n * kKernelSize);
  uint64_t t = 1'000'000'000;
  for (size_t i = 0; i < n; ++i) {
    size_t at = s.buffer.size();
    uint32_t corr = static_cast<uint32_t>(i + 1), stream = static_cast<uint32_t>(i % 4 + 7);
    int pick = static_cast<int>(i % 10);
    if (pick < 6) {
      s.buffer.resize(at + kKernelSize);
      Put<uint32_t>(s.buffer, at, 0, abi::kind::kConcurrentKernel);
      Put<uint16_t>(s.buffer, at, abi::kernel::kRegistersPerThread, 32);
      Put<uint64_t>(s.buffer, at, abi::kernel::kStart, t);
      Put<uint64_t>(s.buffer, at, abi::kernel::kEnd, t + 5000);
      Put<uint32_t>(s.buffer, at, abi::kernel::kStreamId, stream);
      uint32_t grid[3] = {256, 1, 1}, block[3] = {128, 1, 1};
      std::memcpy(s.buffer.data() + at + abi::kernel::kGridX, grid, 12);
      std::memcpy(s.buffer.data() + at + abi::kernel::kBlockX, block, 12);
      Put<uint32_t>(s.buffer, at, abi::kernel::kCorrelationId, corr);
      Put<const char*>(s.buffer, at, abi::kernel::kName, kKernelNames[i % 20]);
    } else if (pick < 9) {
      s.buffer.resize(at + kMemcpySize);
      Put<uint32_t>(s.buffer, at, 0, abi::kind::kMemcpy);
      Put<uint8_t>(s.buffer, at, abi::memcpy::kCopyKind, pick == 6 ? abi::kCopyHtoD : abi::kCopyDtoH);
      Put<uint8_t>(s.buffer, at, abi::memcpy::kSrcKind, 2);
      Put<uint8_t>(s.buffer, at, abi::memcpy::kDstKind, 3);
      Put<uint64_t>(s.buffer, at, abi::memcpy::kBytes, uint64_t{4096} << (i % 5));
      Put<uint64_t>(s.buffer, at, abi::memcpy::kStart, t);
      Put<uint64_t>(s.buffer, at, abi::memcpy::kEnd, t + 2000);
      Put<uint32_t>(s.buffer, at, abi::memcpy::kStreamId, stream);
      Put<uint32_t>(s.buffer, at, abi::memcpy::kCorrelationId, corr);
    } else {
      s.buffer.resize(at + kMemsetSize);
      Put<uint32_t>(s.buffer, at, 0, abi::kind::kMemset);
      Put<uint64_t>(s.buffer, at, abi::memset::kBytes, 4096);
      Put<uint64_t>(s.buffer, at, abi::memset::kStart, t);
      Put<uint64_t>(s.buffer, at, abi::memset::kEnd, t + 1000);
      Put<uint32_t>(s.buffer, at, abi::memset::kStreamId, stream);
      Put<uint32_t>(s.buffer, at, abi::memset::kCorrelationId, corr);
      Put<uint16_t>(s.buffer, at, abi::memset::kMemoryKind, 3);
    }
    s.offsets.push_back(at);
    gpu::ApiEvent e;
    e.start_ns = t - 3000;
    e.end_ns = t - 1000;
    e.function = "cuLaunchKernel";
    e.tid = 1000 + static_cast<uint32_t>(i % 2);
    e.correlation_id = corr;
    e.cbid = pick < 6 ? abi::cbid::kLaunchKernel : pick < 9 ? abi::cbid::kMemcpyHtoDAsync : abi::cbid::kMemsetD8Async;
    s.launches.push_back(e);
    t += 6000;
  }
  return s;
}

gpu::ClockMap Clock() {
  gpu::ClockMap c;
  c.AddSample(1'000'000'000, 0, 0);
  c.AddSample(2'000'000'000, 1'000'000'000, 1'000'000'000);
  return c;
}

// The floor: walk the records, read the kind, copy the bytes out.
void BM_Floor_WalkAndCopy(benchmark::State& state) {
  const Synthetic& s = Make(state.range(0));
  std::vector<uint8_t> out(kKernelSize);
  for (auto _ : state) {
    uint64_t sum = 0;
    for (size_t i = 0; i < s.offsets.size(); ++i) {
      const uint8_t* r = s.buffer.data() + s.offsets[i];
      uint32_t kind;
      std::memcpy(&kind, r, 4);
      size_t size = kind == abi::kind::kConcurrentKernel ? kKernelSize : kMemcpySize;
      std::memcpy(out.data(), r, size);
      sum += kind + out[17];
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(state.iterations() * s.offsets.size());
}

void BM_Parse(benchmark::State& state) {
  const Synthetic& s = Make(state.range(0));
  for (auto _ : state) {
    gpu::GpuCollector c(gpu::GpuLimits{1ull << 40, 0});
    for (size_t off : s.offsets) c.AddRecord(s.buffer.data() + off);
    benchmark::DoNotOptimize(c.records());
  }
  state.SetItemsProcessed(state.iterations() * s.offsets.size());
}

void BM_ParseAndModel(benchmark::State& state) {
  const Synthetic& s = Make(state.range(0));
  bool launches = state.range(1) != 0;
  for (auto _ : state) {
    gpu::GpuCollector c(gpu::GpuLimits{1ull << 40, 0});
    for (size_t off : s.offsets) c.AddRecord(s.buffer.data() + off);
    if (launches)
      for (const gpu::ApiEvent& e : s.launches) c.AddApiEvent(e);
    model::Space space;
    c.Export(Clock(), &space);
    benchmark::DoNotOptimize(space.planes.size());
  }
  state.SetItemsProcessed(state.iterations() * s.offsets.size());
}

void BM_ParseModelAndXplane(benchmark::State& state) {
  const Synthetic& s = Make(state.range(0));
  bool launches = state.range(1) != 0;
  for (auto _ : state) {
    gpu::GpuCollector c(gpu::GpuLimits{1ull << 40, 0});
    for (size_t off : s.offsets) c.AddRecord(s.buffer.data() + off);
    if (launches)
      for (const gpu::ApiEvent& e : s.launches) c.AddApiEvent(e);
    model::Space space;
    c.Export(Clock(), &space);
    std::string out;
    benchmark::DoNotOptimize(exporter::SerializeXSpace(space, &out).ok());
    state.counters["bytes_per_record"] = static_cast<double>(out.size()) / static_cast<double>(s.offsets.size());
  }
  state.SetItemsProcessed(state.iterations() * s.offsets.size());
}

}  // namespace

BENCHMARK(BM_Floor_WalkAndCopy)->Arg(1 << 20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Parse)->Arg(1 << 20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParseAndModel)->Args({1 << 20, 0})->Args({1 << 20, 1})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParseModelAndXplane)->Args({1 << 20, 0})->Args({1 << 20, 1})->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
