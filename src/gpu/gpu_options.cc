#include "gpu/gpu_options.h"

#include "common/quote.h"

namespace spyglass::gpu {
namespace {

struct Range {
  const char* key;
  int64_t min, max;
};
constexpr Range kRanges[] = {
    {"gpu_max_callback_api_events", 0, kMaxCallbackEvents},
    {"gpu_max_activity_api_events", 0, kMaxActivityEvents},
    {"gpu_max_annotation_strings", 0, int64_t{1} << 30},
    {"gpu_pm_sample_interval_us", 1, 1'000'000},
    {"gpu_pm_sample_buffer_size_per_gpu_mb", 64, 4096},
    {"gpu_num_chips_to_profile_per_task", 0, 1 << 16},
};

std::vector<std::string> SplitCounters(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string part = s.substr(i, j - i);
    while (!part.empty() && part.front() == ' ') part.erase(part.begin());
    while (!part.empty() && part.back() == ' ') part.pop_back();
    if (!part.empty()) out.push_back(part);
    i = j + 1;
  }
  return out;
}

}  // namespace

session::TracerOptionSpec GpuOptionSpec() {
  using session::OptionType;
  return {{
              {"gpu_max_callback_api_events", OptionType::kInt},
              {"gpu_max_activity_api_events", OptionType::kInt},
              {"gpu_max_annotation_strings", OptionType::kInt},
              {"gpu_enable_nvtx_tracking", OptionType::kBool},
              {"gpu_enable_cupti_activity_graph_trace", OptionType::kBool},
              {"gpu_dump_graph_node_mapping", OptionType::kBool},
              {"gpu_pm_sample_counters", OptionType::kString},
              {"gpu_pm_sample_interval_us", OptionType::kInt},
              {"gpu_pm_sample_buffer_size_per_gpu_mb", OptionType::kInt},
              {"gpu_num_chips_to_profile_per_task", OptionType::kInt},
          },
          ValidateGpuOptions};
}

Status ValidateGpuOptions(const profiler::ProfileOptions& o) {
  for (const Range& r : kRanges) {
    auto it = o.advanced_configuration.find(r.key);
    if (it == o.advanced_configuration.end() || !it->second.is_int()) continue;
    int64_t v = it->second.as_int();
    if (v < r.min || v > r.max)
      return InvalidArgumentError(std::string("advanced_configuration key '") + r.key + "' must be between " +
                                  std::to_string(r.min) + " and " + std::to_string(r.max) + ", got " +
                                  std::to_string(v));
  }
  auto it = o.advanced_configuration.find("gpu_pm_sample_counters");
  if (it != o.advanced_configuration.end() && it->second.is_string()) {
    const std::string& s = it->second.as_string();
    if (s.size() > 4096)
      return InvalidArgumentError("advanced_configuration key 'gpu_pm_sample_counters' is too long (" +
                                  std::to_string(s.size()) + " bytes, at most 4096)");
    for (const std::string& c : SplitCounters(s))
      for (char ch : c)
        if (!(isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.'))
          return InvalidArgumentError("advanced_configuration key 'gpu_pm_sample_counters': " + QuoteInput(c) +
                                      " is not a metric name (letters, digits, '_' and '.'; comma separated)");
  }
  return Status::Ok();
}

GpuOptions ParseGpuOptions(const profiler::ProfileOptions& o) {
  GpuOptions g;
  for (const auto& [key, v] : o.advanced_configuration) {
    if (key.rfind("gpu_", 0) != 0) continue;
    g.any_gpu_key = true;
    if (key == "gpu_max_callback_api_events" && v.is_int()) g.max_callback_api_events = v.as_int();
    if (key == "gpu_max_activity_api_events" && v.is_int()) g.max_activity_api_events = v.as_int();
    if (key == "gpu_max_annotation_strings" && v.is_int()) g.max_annotation_strings = v.as_int();
    if (key == "gpu_enable_nvtx_tracking" && v.is_bool()) g.enable_nvtx_tracking = v.as_bool();
    if (key == "gpu_enable_cupti_activity_graph_trace" && v.is_bool()) g.enable_activity_graph_trace = v.as_bool();
    if (key == "gpu_dump_graph_node_mapping" && v.is_bool()) g.dump_graph_node_mapping = v.as_bool();
    if (key == "gpu_pm_sample_counters" && v.is_string()) g.pm_sample_counters = SplitCounters(v.as_string());
    if (key == "gpu_pm_sample_interval_us" && v.is_int()) g.pm_sample_interval_us = v.as_int();
    if (key == "gpu_pm_sample_buffer_size_per_gpu_mb" && v.is_int()) g.pm_sample_buffer_size_per_gpu_mb = v.as_int();
    if (key == "gpu_num_chips_to_profile_per_task" && v.is_int()) g.num_chips_to_profile_per_task = v.as_int();
  }
  if (g.max_callback_api_events == 0) g.max_callback_api_events = kMaxCallbackEvents;  // 0: no limit (as XLA)
  return g;
}

}  // namespace spyglass::gpu
