// Conversion of CUPTI activity records to the model and to .xplane.pb, in
// records per second, from synthetic buffers laid out as CUPTI writes them
// (Kernel9 / Memcpy5 / Memset4 sizes and offsets of src/gpu/cupti_abi.h):
// 60% kernels (20 distinct, one launch configuration each), 30% copies (a few
// sizes), 10% memsets, on 4 streams, with a host launch event per record.
//
// Same-run baselines: the floor (read each record's kind and copy its 216
// bytes: what walking the buffer costs) and the naive way (each record
// straight into protobuf XPlane messages, as an XPlaneBuilder does, detail
// strings formatted per event, then SerializeToString). Ours in steps: the
// parse into our compact events (AddRecord), + the model (Export), +
// serializing (.xplane.pb): the last is the end-to-end figure.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <string>
#include <vector>

#include "export/xplane/xplane_writer.h"
#include "xplane.pb.h"
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

// The naive baseline: protobuf messages per record.
void BM_Naive_ProtobufPerRecord(benchmark::State& state) {
  const Synthetic& s = Make(state.range(0));
  for (auto _ : state) {
    tensorflow::profiler::XSpace space;
    tensorflow::profiler::XPlane* plane = space.add_planes();
    plane->set_name("/device:GPU:0");
    std::unordered_map<uint32_t, tensorflow::profiler::XLine*> lines;
    std::unordered_map<std::string, int64_t> event_ids;
    auto event_id = [&](const std::string& name) {
      auto [it, fresh] = event_ids.emplace(name, static_cast<int64_t>(event_ids.size() + 1));
      if (fresh) (*plane->mutable_event_metadata())[it->second].set_name(name);
      return it->second;
    };
    char buf[256];
    for (size_t off : s.offsets) {
      const uint8_t* r = s.buffer.data() + off;
      uint32_t kind = abi::Field<uint32_t>(r, 0);
      bool kernel = kind == abi::kind::kConcurrentKernel, copy = kind == abi::kind::kMemcpy;
      size_t o_start = kernel ? abi::kernel::kStart : copy ? abi::memcpy::kStart : abi::memset::kStart;
      uint32_t stream = abi::Field<uint32_t>(r, kernel ? abi::kernel::kStreamId : copy ? abi::memcpy::kStreamId : abi::memset::kStreamId);
      tensorflow::profiler::XLine*& line = lines[stream];
      if (line == nullptr) {
        line = plane->add_lines();
        line->set_id(stream);
        line->set_name("Stream #" + std::to_string(stream));
      }
      tensorflow::profiler::XEvent* ev = line->add_events();
      uint64_t start = abi::Field<uint64_t>(r, o_start), end = abi::Field<uint64_t>(r, o_start + 8);
      ev->set_offset_ps(static_cast<int64_t>(start - 1'000'000'000) * 1000);
      ev->set_duration_ps(static_cast<int64_t>(end - start) * 1000);
      tensorflow::profiler::XStat* detail = ev->add_stats();
      detail->set_metadata_id(1);
      if (kernel) {
        ev->set_metadata_id(event_id(abi::Field<const char*>(r, abi::kernel::kName)));
        uint32_t grid[3], block[3];
        std::memcpy(grid, r + abi::kernel::kGridX, 12);
        std::memcpy(block, r + abi::kernel::kBlockX, 12);
        std::snprintf(buf, sizeof buf, "regs:%u static_shared:%u dynamic_shared:%u grid:%u,%u,%u block:%u,%u,%u",
                      abi::Field<uint16_t>(r, abi::kernel::kRegistersPerThread),
                      abi::Field<uint32_t>(r, abi::kernel::kStaticShared),
                      abi::Field<uint32_t>(r, abi::kernel::kDynamicShared), grid[0], grid[1], grid[2], block[0],
                      block[1], block[2]);
      } else if (copy) {
        ev->set_metadata_id(event_id("MemcpyH2D"));
        std::snprintf(buf, sizeof buf, "kind_src:pinned kind_dst:device size:%llu dest:0 async:0",
                      static_cast<unsigned long long>(abi::Field<uint64_t>(r, abi::memcpy::kBytes)));
      } else {
        ev->set_metadata_id(event_id("Memset 3"));
        std::snprintf(buf, sizeof buf, "kind:device num_bytes:%llu async:0",
                      static_cast<unsigned long long>(abi::Field<uint64_t>(r, abi::memset::kBytes)));
      }
      detail->set_str_value(buf);
      tensorflow::profiler::XStat* corr = ev->add_stats();
      corr->set_metadata_id(2);
      corr->set_uint64_value(abi::Field<uint32_t>(r, kernel ? abi::kernel::kCorrelationId : copy ? abi::memcpy::kCorrelationId : abi::memset::kCorrelationId));
      tensorflow::profiler::XStat* ctx = ev->add_stats();
      ctx->set_metadata_id(3);
      ctx->set_str_value("$$1");
    }
    std::string out;
    benchmark::DoNotOptimize(space.SerializeToString(&out));
    state.counters["bytes_per_record"] = static_cast<double>(out.size()) / static_cast<double>(s.offsets.size());
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

// The records (and with `launches` their host launch events) converted into `space`.
void Convert(const Synthetic& s, bool launches, model::Space* space) {
  gpu::GpuCollector c(gpu::GpuLimits{1ull << 40, 0});
  for (size_t off : s.offsets) c.AddRecord(s.buffer.data() + off);
  if (launches) {
    c.SetApiEvents(s.launches);  // as the tracer does: read in place
  }
  c.Export(Clock(), space);
}

void BM_ParseAndModel(benchmark::State& state) {
  const Synthetic& s = Make(state.range(0));
  bool launches = state.range(1) != 0;
  for (auto _ : state) {
    model::Space space;
    Convert(s, launches, &space);
    benchmark::DoNotOptimize(space.planes.size());
  }
  state.SetItemsProcessed(state.iterations() * s.offsets.size());
}

void BM_ParseModelAndXplane(benchmark::State& state) {
  const Synthetic& s = Make(state.range(0));
  bool launches = state.range(1) != 0;
  for (auto _ : state) {
    model::Space space;
    Convert(s, launches, &space);
    std::string out;
    benchmark::DoNotOptimize(exporter::SerializeXSpace(space, &out).ok());
    state.counters["bytes_per_record"] = static_cast<double>(out.size()) / static_cast<double>(s.offsets.size());
  }
  state.SetItemsProcessed(state.iterations() * s.offsets.size());
}

}  // namespace

BENCHMARK(BM_Floor_WalkAndCopy)->Arg(1 << 20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Naive_ProtobufPerRecord)->Arg(1 << 20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Parse)->Arg(1 << 20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParseAndModel)->Args({1 << 20, 0})->Args({1 << 20, 1})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParseModelAndXplane)->Args({1 << 20, 0})->Args({1 << 20, 1})->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
