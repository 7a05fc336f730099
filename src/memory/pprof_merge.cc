#include "memory/pprof_merge.h"

#include <map>
#include <tuple>
#include <utility>

#include "memory/pprof.h"

namespace spyglass::memory {

Status MergePprof(const std::vector<std::string_view>& profiles, std::string* out) {
  ProfileData merged;
  // Frames shared by the inputs become one function and one location.
  std::map<std::tuple<std::string_view, std::string_view>, uint64_t> function_ids;
  std::map<std::pair<uint64_t, int64_t>, uint64_t> location_ids;
  std::vector<PprofProfile> parsed(profiles.size());  // the views below point into them
  for (size_t i = 0; i < profiles.size(); ++i) {
    PprofProfile& p = parsed[i];
    if (Status s = ParsePprof(profiles[i], &p); !s.ok())
      return InvalidArgumentError("memory profile " + std::to_string(i + 1) + " of " +
                                  std::to_string(profiles.size()) + ": " + s.message());
    if (p.bytes_index < 0)
      return InvalidArgumentError("memory profile " + std::to_string(i + 1) + " has no space/bytes sample type");
    if (i == 0) merged.time_nanos = p.time_nanos;
    for (std::string_view c : p.comments) merged.comments.emplace_back(c);
    for (const PprofSample& s : p.samples) {
      ProfileSample out_sample;
      for (const PprofFrame& f : s.frames) {
        auto [fit, fnew] = function_ids.try_emplace({f.function, f.file}, merged.functions.size() + 1);
        if (fnew) merged.functions.push_back({std::string(f.function), std::string(f.function), std::string(f.file), 0});
        auto [lit, lnew] = location_ids.try_emplace({fit->second, f.line}, merged.locations.size() + 1);
        if (lnew) merged.locations.push_back({0, {{fit->second, f.line}}});
        out_sample.location_ids.push_back(lit->second);
      }
      const auto value = [&](int index) -> int64_t {
        return index >= 0 && static_cast<size_t>(index) < s.values.size() ? s.values[index] : 0;
      };
      out_sample.bytes = value(p.bytes_index);
      out_sample.count = p.count_index >= 0 ? value(p.count_index) : 1;
      if (auto k = s.labels.find("kind"); k != s.labels.end()) out_sample.kind = std::string(k->second);
      if (auto d = s.labels.find("device"); d != s.labels.end()) out_sample.device = std::string(d->second);
      merged.samples.push_back(std::move(out_sample));
    }
  }
  *out = EncodePprofGz(merged);
  return Status::Ok();
}

}  // namespace spyglass::memory
