// Writes one model with every case the Perfetto writer handles through the
// one export step, as <dir>/fixture.xplane.pb and <dir>/perfetto_trace.pb:
// nesting, overlap that does not nest, instants, unsorted lines, args of
// every kind, GPU launch -> kernel flows, producer/consumer pairs, memory
// and PM counters, drops, CPU samples (stacks sharing callers, native and
// Python frames, a truncated stack, a sampled thread with annotations and one
// without). compare_with_xplane.py checks one against the other.
// `perfetto_fixture --from RUN.xplane.pb DIR`: the perfetto_trace.pb of a
// recorded run (a sampled one: `spyglass run` writes no native trace).
#include <cstdio>

#include "export/export.h"
#include "export/perfetto/perfetto_writer.h"
#include "model/schema.h"
#include "model/xspace.h"
#include "model/xspace_read.h"
#include "sampling/cpu_model.h"

namespace model = spyglass::model;
namespace exporter = spyglass::exporter;

namespace {

constexpr int64_t kNs = 1000;  // ps

namespace sampling = spyglass::sampling;

// A stack node as the sampler writes one (sampling/cpu_model.h).
uint32_t Node(model::Plane& p, uint32_t parent, const char* fn, const char* file, int64_t line, uint64_t address,
              bool python = false) {
  static int next = 0;
  uint32_t id = p.intern_event(std::string(sampling::kCpuStackNodePrefix) + std::to_string(next++));
  std::vector<model::Stat> stats;
  stats.push_back(p.ref_stat(sampling::kCpuFrameStat, fn));
  if (*file) stats.push_back(p.ref_stat(sampling::kCpuFileStat, file));
  if (line > 0) stats.push_back(p.int_stat(sampling::kCpuLineStat, line));
  if (address) stats.push_back(p.uint_stat(sampling::kCpuAddressStat, address));
  if (parent) stats.push_back(p.uint_stat(sampling::kCpuParentStat, parent));
  stats.push_back(p.ref_stat(sampling::kCpuFrameKindStat, python ? "python" : "native"));
  p.event_metadata_at(id).display_name = fn;
  p.event_metadata_at(id).stats = std::move(stats);
  return id;
}

model::Event Ev(model::Plane& p, const char* name, int64_t start_ns, int64_t dur_ps) {
  model::Event e;
  e.offset_ps = start_ns * kNs;
  e.duration_ps = dur_ps;
  e.metadata_id = p.intern_event(name);
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string_view(argv[1]) == "--from") {
    model::Space run;
    exporter::OutputDir dir;
    spyglass::Status s = model::ReadXSpaceFile(argv[2], &run);
    if (s.ok()) s = exporter::OutputDir::Open(argv[3], &dir);
    if (s.ok()) s = exporter::WritePerfettoTrace(run, dir, "perfetto_trace.pb");
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: perfetto_fixture DIR | perfetto_fixture --from RUN.xplane.pb DIR\n");
    return 2;
  }
  model::Space space;
  model::Plane& host = space.plane(model::kHostPlaneName);
  host.stats.push_back(host.int_stat(model::kProcessIdStat, 4242));
  host.stats.push_back(host.str_stat(model::kProcessNameStat, "fixture"));
  host.stats.push_back(host.uint_stat(model::kDroppedEventsStat, 3));
  {
    model::Line& main = host.line_with_id(4242);
    main.name = "main";
    main.timestamp_ns = 1'000'000'000;
    auto add = [&](model::Event e, std::initializer_list<model::Stat> stats = {}) {
      if (stats.size() != 0) main.add_stats(e, std::span<const model::Stat>(stats.begin(), stats.size()));
      main.events.push_back(e);
    };
    add(Ev(host, "step", 0, 1000 * kNs), {host.int_stat(model::kStepNumStat, 1)});
    add(Ev(host, "forward", 10, 300 * kNs),
        {host.int_stat("int", -5), host.uint_stat("uint", 1ull << 63), host.double_stat("double", 0.25),
         host.str_stat("str", "caf\xc3\xa9 \"quoted\""), host.ref_stat("ref", "a referenced name"),
         host.int_stat("_r", 1)});
    add(Ev(host, "launch", 20, 5 * kNs), {host.uint_stat(model::kCorrelationIdStat, 7)});
    add(Ev(host, "launch", 40, 5 * kNs), {host.uint_stat(model::kCorrelationIdStat, 8)});
    add(Ev(host, "instant", 50, 400));  // under a nanosecond
    add(Ev(host, "backward", 400, 500 * kNs));
    // Starts inside "backward" and ends after "step": nests in neither.
    add(Ev(host, "straddle", 800, 400 * kNs));
    add(Ev(host, "ns::layer", 1500, 100 * kNs));  // an annotation whose name holds "::"
    add(Ev(host, "same start", 2000, 10 * kNs));
    add(Ev(host, "same start inner", 2000, 5 * kNs));
    add(Ev(host, "produce", 3000, 10 * kNs), {host.int_stat("_pt", 1), host.uint_stat("_p", 99)});
    // A second line, unsorted, with the consumer of that pair.
    model::Line& worker = host.line_with_id(4243);
    worker.name = "worker";
    worker.timestamp_ns = 1'000'000'000;
    model::Event late = Ev(host, "late", 5000, 10 * kNs);
    model::Event consume = Ev(host, "consume", 3500, 10 * kNs);
    model::Stat cs[] = {host.int_stat("_ct", 1), host.uint_stat("_c", 99)};
    worker.add_stats(consume, cs);
    worker.events.push_back(late);
    worker.events.push_back(consume);
    worker.events.push_back(Ev(host, "early", 100, 10 * kNs));
    // Memory over time.
    model::Line& counters = host.line_with_id(INT64_MAX);
    counters.name = counters.display_name = std::string(model::kCounterLineName);
    counters.timestamp_ns = 1'000'000'000;
    int64_t live[] = {0, 4096, 216, 2 << 20};
    for (int i = 0; i < 4; ++i) {
      model::Event e = Ev(host, "memory cpu", i * 100, 0);
      model::Stat s = host.int_stat(model::kLiveBytesStat, live[i]);
      counters.add_stats(e, std::span<const model::Stat>(&s, 1));
      counters.events.push_back(e);
    }
  }
  {
    // CPU samples: on "main" (which has annotations) and on a thread that
    // has nothing else (its track is named by its sample line).
    host.stats.push_back(host.uint_stat(sampling::kCpuSamplePeriodStat, 1'001'001));
    uint32_t start = Node(host, 0, "_start", "", 0, 0x1010);
    uint32_t main_fn = Node(host, start, "main", "main.cc", 12, 0x1200);
    uint32_t py_step = Node(host, main_fn, "train_step", "train.py", 40, 0, /*python=*/true);
    uint32_t matmul = Node(host, py_step, "matmul", "ops.cc", 7, 0x2400);
    uint32_t relu = Node(host, py_step, "relu", "", 0, 0x2800);
    uint32_t truncated = Node(host, 0, std::string(sampling::kTruncatedFrame).c_str(), "", 0, 0);
    uint32_t deep = Node(host, truncated, "deep_leaf", "deep.cc", 99, 0x3000);
    auto samples = [&](int64_t tid, const char* name, std::initializer_list<std::pair<int64_t, uint32_t>> at) {
      model::Line& l = host.line_with_id(sampling::kCpuSampleLineIdBase + tid);
      l.name = std::string(sampling::kCpuSamplesLineName);
      l.display_name = std::string(name) + " " + std::to_string(tid) + " CPU samples";
      l.timestamp_ns = 1'000'000'000;
      for (auto [ns, leaf] : at) {
        model::Event e;
        e.offset_ps = ns * kNs;
        e.duration_ps = 1'001'001 * kNs;
        e.metadata_id = leaf;
        if (leaf == matmul || (leaf == relu && tid == 4242)) {
          // Open annotations, outer::inner; one of them a C++ name (an annotation of its own, not two).
          model::Stat s = host.ref_stat(model::kAnnotationStackStat, leaf == matmul ? "step::forward" : "step::ns::layer");
          l.add_stats(e, std::span<const model::Stat>(&s, 1));
        }
        l.events.push_back(e);
      }
    };
    samples(4242, "main", {{15, matmul}, {1100, matmul}, {2100, relu}, {3100, main_fn}, {3100, deep}});
    samples(4244, "sampled only", {{200, relu}, {1200, deep}, {2200, start}});
  }
  model::Plane& gpu = space.plane(std::string(model::kGpuPlanePrefix) + "0");
  gpu.id = 0;
  gpu.stats.push_back(gpu.int_stat(model::kProcessIdStat, 4242));
  {
    model::Line& stream = gpu.line_with_id(7);
    stream.name = "Stream #7(Kernel)";
    stream.timestamp_ns = 1'000'000'000;
    model::Event k1 = Ev(gpu, "kernel_a", 30, 20 * kNs + 123);
    model::Event k2 = Ev(gpu, "kernel_b", 60, 20 * kNs);
    model::Stat s1 = gpu.uint_stat(model::kCorrelationIdStat, 7), s2 = gpu.uint_stat(model::kCorrelationIdStat, 8);
    stream.add_stats(k1, std::span<const model::Stat>(&s1, 1));
    stream.add_stats(k2, std::span<const model::Stat>(&s2, 1));
    stream.events.push_back(k1);
    stream.events.push_back(k2);
    model::Line& pm = gpu.line_with_id(INT64_MAX);
    pm.name = pm.display_name = std::string(model::kCounterLineName);
    pm.timestamp_ns = 1'000'000'000;
    for (int i = 0; i < 3; ++i) {
      model::Event e = Ev(gpu, "sm__throughput", i * 50, 0);
      model::Stat s = gpu.double_stat("sm__throughput", 12.5 * i);
      pm.add_stats(e, std::span<const model::Stat>(&s, 1));
      pm.events.push_back(e);
    }
  }
  exporter::OutputDir dir;
  if (auto s = exporter::OutputDir::Open(argv[1], &dir); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  exporter::ExportRequest request{{exporter::Format::kXPlane, exporter::Format::kPerfettoTrace}, "fixture", {}};
  exporter::ExportedFiles files;
  if (auto s = exporter::Export(space, dir, request, &files); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s\n%s\n", files.xplane.c_str(), files.perfetto_trace.c_str());
  return 0;
}
