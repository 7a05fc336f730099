#include "sampling/sampler_options.h"

#include <string>

#include "common/quote.h"

namespace spyglass::sampling {
namespace {

constexpr const char* kHzKey = "spyglass_cpu_sample_hz";
constexpr const char* kModeKey = "spyglass_cpu_sample_mode";

Status Validate(const profiler::ProfileOptions& o) {
  const auto& c = o.advanced_configuration;
  int64_t hz = 0;
  if (auto it = c.find(kHzKey); it != c.end() && it->second.is_int()) {
    hz = it->second.as_int();
    const uint64_t max = MaxSampleRate();
    if (hz < 0 || static_cast<uint64_t>(hz) > max)
      return InvalidArgumentError(std::string("advanced_configuration key '") + kHzKey + "' must be between 0 (off) and " +
                                  std::to_string(max) +
                                  " (the kernel's perf_event_max_sample_rate), got " + std::to_string(hz));
  }
  if (auto it = c.find(kModeKey); it != c.end() && it->second.is_string()) {
    const std::string& m = it->second.as_string();
    if (m != "cpu" && m != "wall")
      return InvalidArgumentError(std::string("advanced_configuration key '") + kModeKey +
                                  "' must be cpu or wall, got " + QuoteInput(m));
    if (hz == 0)
      return InvalidArgumentError(std::string("advanced_configuration key '") + kModeKey + "' needs a rate: set '" +
                                  kHzKey + "' above 0");
  }
  return Status::Ok();
}

}  // namespace

session::TracerOptionSpec SamplerOptionSpec() {
  return {{{kHzKey, session::OptionType::kInt}, {kModeKey, session::OptionType::kString}}, Validate};
}

SamplerOptions ParseSamplerOptions(const profiler::ProfileOptions& o) {
  SamplerOptions s;
  const auto& c = o.advanced_configuration;
  if (auto it = c.find(kHzKey); it != c.end() && it->second.is_int() && it->second.as_int() > 0)
    s.hz = static_cast<uint64_t>(it->second.as_int());
  if (auto it = c.find(kModeKey); it != c.end() && it->second.is_string() && it->second.as_string() == "wall")
    s.mode = SampleMode::kWall;
  return s;
}

}  // namespace spyglass::sampling
