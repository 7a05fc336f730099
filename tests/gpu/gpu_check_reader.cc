// Checks what gpu_check_program wrote on a real GPU (scripts/gpu_check.sh):
// kernels, copies and memsets on /device:GPU:0 inside their annotations, the
// copy byte counts, the launch <-> kernel link by correlation_id, and the GPU
// allocation in the pprof at allocate_buffers. Needs no Python (the GPU
// machine has none of our peers).
//
//   gpu_check_reader <file.xplane.pb> <gpu.pprof.gz>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "memory/pprof.h"
#include "model/schema.h"
#include "model/xspace_import.h"

namespace {

int failures = 0;
void Expect(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

struct Found {
  int64_t start_ps = -1, duration_ps = 0;
  uint64_t correlation = 0;
  std::string annotation, details;
};

Found FindDevice(const spyglass::model::Plane& p, const std::string& name_part, const std::string& detail_key,
                 const std::string& detail_part) {
  for (const auto& l : p.lines)
    for (const auto& e : l.events) {
      if (p.event_metadata()[e.metadata_id].name.find(name_part) == std::string::npos) continue;
      Found f;
      f.start_ps = l.timestamp_ns * 1000 + e.offset_ps;
      f.duration_ps = e.duration_ps;
      for (const auto& s : l.stats_of(e)) {
        const std::string& k = p.stat_name(s);
        if (k == spyglass::model::kCorrelationIdStat) f.correlation = s.u64;
        if (k == spyglass::model::kAnnotationStackStat) f.annotation = p.stat_text(s);
        if (k == detail_key) f.details = p.stat_text(s);
      }
      if (detail_part.empty() || f.details.find(detail_part) != std::string::npos) return f;
    }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace spyglass;
  if (argc != 3) {
    std::fprintf(stderr, "usage: gpu_check_reader <file.xplane.pb> <gpu.pprof.gz>\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  model::Space space;
  Status s = model::ImportXSpaceBytes(buf.str(), &space);
  Expect(s.ok(), "read " + std::string(argv[1]) + (s.ok() ? "" : ": " + s.message()));
  for (const auto& w : space.warnings) std::printf("warning in the profile: %s\n", w.c_str());
  for (const auto& e : space.errors) std::printf("error in the profile: %s\n", e.c_str());
  const model::Plane* gpu = space.find_plane("/device:GPU:0");
  const model::Plane* host = space.find_plane(model::kHostPlaneName);
  Expect(gpu != nullptr, "a /device:GPU:0 plane");
  if (gpu == nullptr || host == nullptr) return 1;

  // The clock map measured on this GPU (docs/gpu.md: the error bound).
  for (const auto& st : gpu->stats) {
    const std::string& n = gpu->stat_name(st);
    if (n == model::kGpuClockSamplesStat || n == model::kGpuClockBoundStat || n == model::kGpuClockSlopeStat ||
        n == model::kGpuDeviceNameStat)
      std::printf("info: %s = %s\n", n.c_str(), gpu->stat_text(st).c_str());
  }

  // PM sampling (gpu_pm_sample_counters): reported, not required (the
  // counters may be restricted to admins; the warning above then says so).
  size_t pm_samples = 0;
  for (const auto& l : gpu->lines)
    if (l.name == model::kCounterLineName) pm_samples += l.events.size();
  std::printf("info: PM sampling: %zu counter samples on /device:GPU:0\n", pm_samples);

  Found k = FindDevice(*gpu, "scale_kernel", std::string(model::kKernelDetailsStat), "block:256,1,1");
  Expect(k.start_ps >= 0, "kernel scale_kernel on /device:GPU:0 (details: " + k.details + ")");
  Expect(k.duration_ps > 0 && k.duration_ps < 1'000'000'000'000, "kernel duration plausible: " +
                                                                     std::to_string(k.duration_ps / 1000) + " ns");
  Expect(k.annotation == "step::compute", "kernel inside step::compute (got '" + k.annotation + "')");
  Found h2d = FindDevice(*gpu, "MemcpyH2D", std::string(model::kMemcpyDetailsStat), "size:1048576 ");
  Expect(h2d.start_ps >= 0 && h2d.details.find("async:1") != std::string::npos,
         "1 MiB async H2D copy: " + h2d.details);
  Expect(h2d.annotation == "step::copy_in", "H2D copy inside step::copy_in (got '" + h2d.annotation + "')");
  Found d2h = FindDevice(*gpu, "MemcpyD2H", std::string(model::kMemcpyDetailsStat), "size:65536 ");
  Expect(d2h.start_ps >= 0, "64 KiB D2H copy: " + d2h.details);
  Expect(d2h.annotation == "step::copy_out", "D2H copy inside step::copy_out (got '" + d2h.annotation + "')");
  Found ms = FindDevice(*gpu, "Memset", std::string(model::kMemsetDetailsStat), "num_bytes:4096 ");
  Expect(ms.start_ps >= 0 && ms.annotation == "step::compute", "4 KiB memset inside step::compute: " + ms.details);

  // The launch: on a host thread, named by the kernel, same correlation id,
  // and before the kernel on the shared time base.
  Found launch;
  for (const auto& l : host->lines)
    for (const auto& e : l.events) {
      if (host->event_metadata()[e.metadata_id].name.find("scale_kernel") == std::string::npos) continue;
      for (const auto& st : l.stats_of(e))
        if (host->stat_name(st) == model::kCorrelationIdStat && st.u64 == k.correlation && k.correlation != 0)
          launch.start_ps = l.timestamp_ns * 1000 + e.offset_ps, launch.correlation = st.u64;
    }
  Expect(launch.start_ps >= 0, "launch of scale_kernel on a host thread with correlation_id " +
                                   std::to_string(k.correlation));
  Expect(launch.start_ps >= 0 && k.start_ps >= launch.start_ps,
         "kernel starts after its launch (clock alignment): launch " + std::to_string(launch.start_ps / 1000) +
             " ns, kernel " + std::to_string(k.start_ps / 1000) + " ns");

  // The live-bytes counter track of GPU 0 (memory timeline tracer).
  bool counter = false;
  for (const auto& l : host->lines)
    if (l.name == model::kCounterLineName)
      for (const auto& e : l.events)
        counter |= host->event_metadata()[e.metadata_id].name.find("gpu:0") != std::string::npos;
  Expect(counter, "a live-bytes counter track for gpu:0 on the host plane");

  memory::PprofProfile prof;
  s = memory::ReadPprofFile(argv[2], &prof);
  Expect(s.ok(), "read " + std::string(argv[2]) + (s.ok() ? "" : ": " + s.message()));
  bool site = false;
  std::string seen;
  for (const auto& smp : prof.samples) {
    auto dev = smp.labels.find("device"), kind = smp.labels.find("kind");
    if (dev == smp.labels.end() || dev->second != "gpu:0") continue;
    std::string top;
    for (const auto& f : smp.frames) top += std::string(f.function) + " < ";
    seen += "\n    " + std::string(kind != smp.labels.end() ? kind->second : "?") + " " +
            std::to_string(prof.bytes_index >= 0 ? smp.values[prof.bytes_index] : -1) + ": " + top.substr(0, 300);
    if (kind != smp.labels.end() && kind->second == "device" && prof.bytes_index >= 0 &&
        smp.values[prof.bytes_index] == (8 << 20) && top.find("allocate_buffers") != std::string::npos)
      site = true;
  }
  Expect(site, "8 MiB gpu:0 'device' allocation at allocate_buffers in the pprof; samples:" + seen);
  std::printf("%s\n", failures ? "GPU CHECK FAILED" : "GPU CHECK OK");
  return failures ? 1 : 0;
}
