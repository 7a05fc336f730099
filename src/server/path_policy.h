// Which files a profile request may make this process write, and writing
// them without following symbolic links.
#pragma once

#include <string>

#include "spyglass/status.h"

namespace spyglass::server {

// Checks `repository_root` (absolute, ends in "plugins/profile", no "." or
// ".." component, no symbolic link in any existing component below
// `allowed_root`, or anywhere when `allowed_root` is empty; inside
// `allowed_root` when set), `session_id` and `host` (plain file-name
// components).
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
