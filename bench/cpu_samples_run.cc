// A sampled run of a given size for bench/cpu_samples_1m_bench.py, and the
// export of it, one step per process (so that each step's peak memory is
// its own):
//   cpu_samples_run gen DIR SAMPLES     writes DIR/plugins/profile/run/host.xplane.pb:
//                                       8 threads sampled at 1 kHz, stacks 8-40
//                                       frames deep over 600 functions (5000
//                                       distinct leaves, the hot ones Zipf-like),
//                                       steps of 100 ms with nested annotations
//   cpu_samples_run export XPLANE DIR   reads it and writes what a session
//                                       writes (.xplane.pb, trace JSON, Perfetto
//                                       trace, the pprof CPU profile and the
//                                       Firefox profile), each timed
// Prints "<step> <seconds>" lines.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "export/export.h"
#include "export/trace_json/trace_json_writer.h"
#include "export/perfetto/perfetto_writer.h"
#include "export/xplane/xplane_writer.h"
#include "model/schema.h"
#include "model/xspace.h"
#include "model/xspace_read.h"
#include "sampling/cpu_model.h"

namespace model = spyglass::model;
namespace exporter = spyglass::exporter;
namespace sampling = spyglass::sampling;

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Gen(const std::string& dir, uint64_t samples) {
  model::Space space;
  model::Plane& host = space.plane(model::kHostPlaneName);
  host.stats.push_back(host.int_stat(model::kProcessIdStat, 4242));
  host.stats.push_back(host.str_stat(model::kProcessNameStat, "bench"));
  constexpr int64_t kPeriodNs = 1'000'000;
  host.stats.push_back(host.uint_stat(sampling::kCpuSamplePeriodStat, kPeriodNs));
  std::mt19937_64 rng(42);
  // Stacks: random walks down a tree of call sites, so that stacks share
  // their callers as real ones do.
  std::vector<uint32_t> leaves;
  int next = 0;
  auto node = [&](uint32_t parent, int fn) {
    uint32_t id = host.intern_event(std::string(sampling::kCpuStackNodePrefix) + std::to_string(next++));
    const std::string name = "function_" + std::to_string(fn);
    std::vector<model::Stat> st{host.ref_stat(sampling::kCpuFrameStat, name),
                                host.ref_stat(sampling::kCpuFileStat, "src/file_" + std::to_string(fn % 60) + ".cc"),
                                host.int_stat(sampling::kCpuLineStat, 10 + fn),
                                host.uint_stat(sampling::kCpuAddressStat, 0x1000 + 16 * fn)};
    if (parent) st.push_back(host.uint_stat(sampling::kCpuParentStat, parent));
    st.push_back(host.ref_stat(sampling::kCpuFrameKindStat, "native"));
    host.event_metadata_at(id).display_name = name;
    host.event_metadata_at(id).stats = std::move(st);
    return id;
  };
  std::vector<std::vector<std::pair<int, uint32_t>>> children(1);  // by node: (function, child)
  children.reserve(1 << 20);
  std::vector<uint32_t> node_of_index{0};
  while (leaves.size() < 5000) {
    size_t at = 0;  // index into children (0: the root)
    const int depth = 8 + static_cast<int>(rng() % 33);
    for (int d = 0; d < depth; ++d) {
      const int fn = static_cast<int>(d == 0 ? 0 : (d * 37 + rng() % (d < 4 ? 2 : 4)) % 600);
      size_t found = SIZE_MAX;
      for (auto& [f, c] : children[at])
        if (f == fn) found = c;
      if (found == SIZE_MAX) {
        found = children.size();
        children[at].emplace_back(fn, found);
        children.emplace_back();
        node_of_index.push_back(node(node_of_index[at], fn));
      }
      at = found;
    }
    leaves.push_back(node_of_index[at]);
  }
  // Annotations on each thread: steps of 100 ms, forward/backward inside.
  constexpr int kThreads = 8;
  const uint64_t per_thread = samples / kThreads;
  const int64_t run_ns = static_cast<int64_t>(per_thread) * kPeriodNs;
  for (int t = 0; t < kThreads; ++t) {
    const int64_t tid = 5000 + t;
    model::Line& ann = host.line_with_id(tid);
    ann.name = t == 0 ? "main" : "worker_" + std::to_string(t);
    for (int64_t s = 0; s * 100'000'000 < run_ns; ++s) {
      model::Event step{s * 100'000'000'000, 100'000'000'000 - 1000, host.intern_event("train")};
      model::Stat n = host.int_stat(model::kStepNumStat, s);
      ann.add_stats(step, {&n, 1});
      ann.events.push_back(step);
      ann.events.push_back({s * 100'000'000'000 + 1000, 60'000'000'000, host.intern_event("forward")});
      ann.events.push_back({s * 100'000'000'000 + 60'001'000'000, 39'000'000'000, host.intern_event("backward")});
    }
    model::Line& line = host.line_with_id(sampling::kCpuSampleLineIdBase + tid);
    line.name = std::string(sampling::kCpuSamplesLineName);
    line.display_name = ann.name + " " + std::to_string(tid) + " CPU samples";
    line.events.reserve(per_thread);
    const model::Stat fwd = host.ref_stat(model::kAnnotationStackStat, "train::forward");
    const model::Stat bwd = host.ref_stat(model::kAnnotationStackStat, "train::backward");
    for (uint64_t k = 0; k < per_thread; ++k) {
      // Hot leaves: the square of a uniform picks low indices more often.
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      model::Event e{static_cast<int64_t>(k) * kPeriodNs * 1000 + t * 997, kPeriodNs * 1000,
                     leaves[static_cast<size_t>(u * u * static_cast<double>(leaves.size()))]};
      const int64_t in_step = (e.offset_ps / 1'000'000) % 100'000;  // us into its step
      line.add_stats(e, {in_step < 60'000 ? &fwd : &bwd, 1});
      line.events.push_back(e);
    }
  }
  host.stats.push_back(host.uint_stat(sampling::kCpuSampleCountStat, per_thread * kThreads));
  const std::string run = dir + "/plugins/profile/run";
  std::filesystem::create_directories(run);
  if (auto s = exporter::WriteXSpaceFile(space, run + "/host.xplane.pb"); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("samples %llu\nstack_nodes %d\n", static_cast<unsigned long long>(per_thread * kThreads), next);
  return 0;
}

int Export(const std::string& xplane, const std::string& dir) {
  auto t0 = std::chrono::steady_clock::now();
  model::Space space;
  if (auto s = model::ReadXSpaceFile(xplane, &space); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("read %.3f\n", Since(t0));
  exporter::OutputDir out;
  std::filesystem::create_directories(dir);
  if (auto s = exporter::OutputDir::Open(dir, &out); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  auto timed = [&](const char* name, const std::function<spyglass::Status()>& write) {
    const auto t = std::chrono::steady_clock::now();
    spyglass::Status s = write();
    if (!s.ok()) std::fprintf(stderr, "%s: %s\n", name, s.ToString().c_str());
    else std::printf("%s %.3f\n", name, Since(t));
    return s.ok();
  };
  if (!timed("xplane", [&] { return exporter::WriteXSpaceFile(space, out, "host.xplane.pb"); }) ||
      !timed("trace_json", [&] { return exporter::WriteTraceJsonGz(space, out, "host.trace.json.gz"); }) ||
      !timed("perfetto", [&] { return exporter::WritePerfettoTrace(space, out, "perfetto_trace.pb"); }))
    return 1;
  t0 = std::chrono::steady_clock::now();
  std::vector<std::string> written;
  if (auto s = sampling::WriteCpuProfiles(space, out, &written); !s.ok()) return 1;
  std::printf("pprof+firefox %.3f\n", Since(t0));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "gen") return Gen(argv[2], std::strtoull(argv[3], nullptr, 10));
  if (argc == 4 && std::string(argv[1]) == "export") return Export(argv[2], argv[3]);
  std::fprintf(stderr, "usage: cpu_samples_run gen DIR SAMPLES | export XPLANE DIR\n");
  return 2;
}
