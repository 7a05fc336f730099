#include "server/merge.h"

#include "common/saturate.h"

namespace spyglass::server {

uint64_t ProfileStartTime(const model::Space& space) {
  const model::Plane* env = space.find_plane(model::kTaskEnvPlaneName);
  if (env == nullptr) return 0;
  for (const model::Stat& s : env->stats)
    if (env->stat_name(s) == model::kProfileStartTimeStat)
      return s.kind == model::StatKind::kUint64 ? s.u64 : static_cast<uint64_t>(s.i64);
  return 0;
}

void MergeChildSpace(model::Space&& child, uint64_t parent_start_ns, const std::string& tag, bool require_process_id,
                     model::Space* parent) {
  uint64_t child_start = ProfileStartTime(child);
  if (child_start == 0) {
    parent->warnings.push_back("profile of " + tag + " has no Task Environment profile_start_time; its times are "
                               "shown as if it started with this process");
    child_start = parent_start_ns;
  }
  for (model::Plane& p : child.planes) {
    if (require_process_id && p.find_stat_metadata(model::kProcessIdStat) == nullptr) {
      parent->warnings.push_back("skipped plane '" + p.name + "' of " + tag + ": it has no process_id");
      continue;
    }
    for (model::Line& l : p.lines) {
      // Denormalize (lines below the start are relative to it), then
      // renormalize to this process's start.
      // (Saturated: the child's file may hold any int64.)
      int64_t abs_ns = l.timestamp_ns < static_cast<int64_t>(child_start)
                           ? SaturatedAdd(l.timestamp_ns, static_cast<int64_t>(child_start))
                           : l.timestamp_ns;
      l.timestamp_ns = SaturatedSub(abs_ns, static_cast<int64_t>(parent_start_ns));
    }
    p.name += " [" + tag + "]";
    parent->planes.push_back(std::move(p));
  }
  for (auto& e : child.errors) parent->errors.push_back(tag + ": " + e);
  for (auto& w : child.warnings) parent->warnings.push_back(tag + ": " + w);
}

}  // namespace spyglass::server
