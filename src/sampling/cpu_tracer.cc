// The CPU sampler as a tracer of the session: its options
// (spyglass_cpu_sample_hz, spyglass_cpu_sample_mode), registered with it,
// and its samples written onto the host plane at CollectData
// (cpu_model.h). Ranked after the host and Python tracers: their lines are on
// the host plane when the samples look up the annotations open on their
// threads.
#include <time.h>

#include <cstdio>
#include <memory>
#include <string>

#include "common/quote.h"
#include "sampling/cpu_model.h"
#include "sampling/cpu_sampler.h"
#include "sampling/sampler_options.h"
#include "session/tracer.h"

namespace spyglass::sampling {
namespace {

constexpr int kRankCpuSampler = 250;

class CpuSamplerTracer : public session::Tracer {
 public:
  explicit CpuSamplerTracer(SamplerOptions o) : options_(o), sampler_(o.hz, o.mode) {}
  Status Start() override {
    start_mono_ns_ = zero().mono_ns;
    Status s = sampler_.Start();
    if (s.ok() && !sampler_.wall_mode_problem().empty())
      std::fprintf(stderr, "spyglass: %s\n", sampler_.wall_mode_problem().c_str());
    if (!s.ok()) {
      std::fprintf(stderr, "spyglass: %s\n", s.message().c_str());
      failure_ = s.message();
    }
    return s;
  }
  Status Stop() override {
    sampler_.Stop();
    return Status::Ok();
  }
  Status CollectData(model::Space* space) override {
    model::Plane& host = space->plane(model::kHostPlaneName);
    if (!failure_.empty()) {
      space->warnings.push_back("spyglass: " + failure_);
      return Status::Ok();
    }
    CpuCapture cap = sampler_.Take();
    samples_ = cap.samples.size();
    const uint64_t lost = cap.lost + cap.dropped;
    if (lost > 0) {
      std::string w = "spyglass: " + std::to_string(lost) + " CPU samples were dropped (" +
                      std::to_string(cap.lost) + " by the kernel, its per-thread rings full; " +
                      std::to_string(cap.dropped) + " over the session's bound of " + std::to_string(kMaxSamples) +
                      ")";
      space->warnings.push_back(w);
      std::fprintf(stderr, "%s\n", w.c_str());
    }
    if (cap.threads_unsampled > 0)
      space->warnings.push_back("spyglass: " + std::to_string(cap.threads_unsampled) +
                                " threads could not be sampled (their perf event or ring was refused: "
                                "perf_event_mlock_kb, RLIMIT_MEMLOCK or RLIMIT_NOFILE)");
    dropped_ = lost;
    AddSamplesToPlane(std::move(cap), start_mono_ns_, options_.mode, &host);
    return Status::Ok();
  }
  void AddStats(session::SessionSummary* summary) const override {
    // Samples are not annotated events (the count the session prints); their drops are drops.
    summary->cpu_samples += samples_;
    summary->dropped_events += dropped_;
  }

 private:
  SamplerOptions options_;
  CpuSampler sampler_;
  uint64_t start_mono_ns_ = 0;
  std::string failure_;
  uint64_t samples_ = 0, dropped_ = 0;
};

std::unique_ptr<session::Tracer> MakeCpuSampler(const profiler::ProfileOptions& o) {
  SamplerOptions s = ParseSamplerOptions(o);
  if (s.hz == 0) return nullptr;
  return std::make_unique<CpuSamplerTracer>(s);
}

}  // namespace
}  // namespace spyglass::sampling

SPYGLASS_REGISTER_TRACER_WITH_OPTIONS(cpu_sampler, spyglass::sampling::kRankCpuSampler,
                                      spyglass::sampling::MakeCpuSampler, spyglass::sampling::SamplerOptionSpec());
