// The TensorBoard/XProf log-dir layout: <log_dir>/plugins/profile/<run>/.
#pragma once

#include <string>

#include "spyglass/status.h"

namespace spyglass::exporter {

// "2026_11_30_13_42_53" in local time, as JAX names runs.
std::string TimestampRunName();

// Makes (creating parents) <log_dir>/plugins/profile/<run>/ and returns it in
// *run_dir. An empty `session_id` gives a timestamp name; when that directory
// already exists a suffix keeps runs apart ("..._1"). A session id must be a
// single plain path component.
Status MakeRunDir(const std::string& log_dir, const std::string& session_id, std::string* run_dir);

// Replaces ':' (and '/') so a host or address is usable as a file stem.
std::string SanitizeHostForFile(const std::string& host);

// Whether `name` is a plain file name: not empty, no '/', not "." or "..", no NUL.
bool IsPlainComponent(const std::string& name);

}  // namespace spyglass::exporter
