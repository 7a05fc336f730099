// Merging a profile captured in another process into this one's model.
#pragma once

#include <string>

#include "model/xspace.h"

namespace spyglass::server {

// The absolute start (Unix ns) of a post-processed space: its Task
// Environment plane's profile_start_time; 0 if it has none.
uint64_t ProfileStartTime(const model::Space& space);

// Moves the planes of `child` into `parent`, renamed "<name> [<tag>]", with
// their line timestamps moved from the child's time base (normalized to its
// own profile_start_time) to `parent_start_ns`. Planes without a process_id
// stat are skipped with a warning when `require_process_id`. The child's
// errors and warnings are appended.
void MergeChildSpace(model::Space&& child, uint64_t parent_start_ns, const std::string& tag, bool require_process_id,
                     model::Space* parent);

}  // namespace spyglass::server
