// The TensorBoard/XProf log-dir layout: <log_dir>/plugins/profile/<run>/.
#pragma once

#include <string>
#include <vector>

#include "export/output_file.h"
#include "spyglass/status.h"

namespace spyglass::exporter {

// "2026_11_30_13_42_53" in local time, as JAX names runs.
std::string TimestampRunName();

struct RunDir {
  OutputDir dir;                      // the run directory, open; dir.path() is its path
  std::vector<std::string> created;   // directories MakeRunDir made, outermost first
};

// Makes <log_dir>/plugins/profile/<run>/ and opens it. log_dir is made with
// its parents if missing (links in it followed: the caller chose it);
// plugins, profile and the run directory must not be symbolic links. An
// empty `session_id` gives a new directory named by the timestamp, with a
// suffix ("..._1", "..._2", ... without end) when that name is taken; the
// suffix continues from this process's last run of the same second, so
// naming stays O(1) per run. A session id must be a single plain component
// (an existing directory of that name is reused).
Status MakeRunDir(const std::string& log_dir, const std::string& session_id, RunDir* run);
Status MakeRunDir(const std::string& log_dir, const std::string& session_id, std::string* run_dir);

// Removes the directories `run` made, innermost first, each only if empty
// (what a failed capture leaves).
void RemoveIfEmpty(const RunDir& run);

// Replaces ':' (and '/') so a host or address is usable as a file stem.
std::string SanitizeHostForFile(const std::string& host);

}  // namespace spyglass::exporter
