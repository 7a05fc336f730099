// Which files a profile request may make this process write, and writing
// them without following symbolic links.
#pragma once

#include <cstddef>
#include <string>

#include "spyglass/status.h"

namespace spyglass::server {

// Bounds of what one request may make the server create: the whole path of
// the profile file (PATH_MAX), each component (NAME_MAX), and how many
// directories that do not exist yet it may create (the usual
// <log_dir>/plugins/profile/<run> needs at most 4).
inline constexpr size_t kMaxProfilePathBytes = 4096;
inline constexpr size_t kMaxNameBytes = 255;
inline constexpr size_t kMaxNewDirectories = 8;

// Checks `repository_root` (absolute, ends in "plugins/profile", no "." or
// ".." component, no symbolic link in any existing component below
// `allowed_root`, or anywhere when `allowed_root` is empty; inside
// `allowed_root` when set), `session_id` and `host` (plain file-name
// components), and the bounds above. Creates nothing; errors quote a bounded
// prefix of the input.
struct ProfileTarget {
  std::string dir;       // <root>/<session_id>
  std::string file;      // <dir>/<host>.xplane.pb
  size_t trusted = 0;    // leading components of dir that may be symbolic links (allowed_root's)
};
Status ResolveProfileFile(const std::string& repository_root, const std::string& session_id, const std::string& host,
                          const std::string& allowed_root, ProfileTarget* target);

// Walks to target.dir component by component, creating what is missing and
// refusing symbolic links (below the trusted prefix), then writes `bytes` to
// target.file as every output is written (exporter::OutputDir: no link
// followed, renamed into place when complete).
Status WriteProfileFile(const ProfileTarget& target, const std::string& bytes);

// A host name or address as a file stem: ':' becomes '_'; InvalidArgument if
// the result is not a plain component ("..", '/', NUL, empty, over 200 bytes).
Status HostFileStem(const std::string& host, std::string* stem);

}  // namespace spyglass::server
