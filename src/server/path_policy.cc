#include "server/path_policy.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <vector>

#include "export/output_file.h"

namespace spyglass::server {
namespace {

// Splits an absolute path into components; false on ".", ".." or empty
// components other than repeated/trailing slashes.
bool Components(const std::string& path, std::vector<std::string>* out, std::string* bad) {
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    std::string c = path.substr(i, j - i);
    if (c == "." || c == "..") {
      *bad = c;
      return false;
    }
    if (!c.empty()) out->push_back(c);
    i = j + 1;
  }
  return true;
}

std::string Join(const std::vector<std::string>& parts, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += "/" + parts[i];
  return s.empty() ? "/" : s;
}

// No existing component among parts[from..] may be a symlink or a non-directory.
Status CheckExistingDirs(const std::vector<std::string>& parts, size_t from, const std::string& what) {
  for (size_t n = from + 1; n <= parts.size(); ++n) {
    std::string p = Join(parts, n);
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) {
      if (errno == ENOENT) return Status::Ok();  // the rest will be created
      return InvalidArgumentError(what + ": cannot inspect " + p + ": " + std::strerror(errno));
    }
    if (S_ISLNK(st.st_mode))
      return InvalidArgumentError(what + " goes through a symbolic link at " + p +
                                  " (refused: pass the real path, without symbolic links)");
    if (!S_ISDIR(st.st_mode)) return InvalidArgumentError(what + ": " + p + " exists and is not a directory");
  }
  return Status::Ok();
}

}  // namespace

Status HostFileStem(const std::string& host, std::string* stem) {
  std::string s = host;
  for (char& c : s)
    if (c == ':') c = '_';
  if (!exporter::IsPlainComponent(s) || s.find('\\') != std::string::npos || s.size() > 200)
    return InvalidArgumentError("host name '" + host +
                                "' is not usable as a file name (it must be a plain name: no '/', not '..')");
  *stem = s;
  return Status::Ok();
}

Status ResolveProfileFile(const std::string& repository_root, const std::string& session_id, const std::string& host,
                          const std::string& allowed_root, ProfileTarget* target) {
  const std::string what = "repository_root '" + repository_root + "'";
  if (repository_root.empty()) return InvalidArgumentError("repository_root is empty");
  if (repository_root.find('\0') != std::string::npos) return InvalidArgumentError(what + " contains a NUL byte");
  if (repository_root[0] != '/')
    return InvalidArgumentError(what + " must be an absolute path (<log_dir>/plugins/profile)");
  std::vector<std::string> parts;
  std::string bad;
  if (!Components(repository_root, &parts, &bad))
    return InvalidArgumentError(what + " contains a '" + bad + "' component (refused)");
  if (parts.size() < 2 || parts[parts.size() - 2] != "plugins" || parts.back() != "profile")
    return InvalidArgumentError(what + " must end in plugins/profile");
  if (!exporter::IsPlainComponent(session_id))
    return InvalidArgumentError("session_id '" + session_id + "' must be a plain directory name (no '/', not '..')");
  std::string stem;
  if (Status s = HostFileStem(host, &stem); !s.ok()) return s;
  size_t from = 0;
  if (!allowed_root.empty()) {
    std::vector<std::string> allowed;
    if (allowed_root[0] != '/' || !Components(allowed_root, &allowed, &bad))
      return InternalError("the server's allowed_log_root '" + allowed_root + "' is not a clean absolute path");
    bool inside = allowed.size() <= parts.size();
    for (size_t i = 0; inside && i < allowed.size(); ++i) inside = allowed[i] == parts[i];
    if (!inside)
      return InvalidArgumentError(what + " is outside the directory this server may write to (" + allowed_root + ")");
    from = allowed.size();
  }
  parts.push_back(session_id);
  if (Status s = CheckExistingDirs(parts, from, what); !s.ok()) return s;
  std::string f = Join(parts, parts.size()) + "/" + stem + ".xplane.pb";
  struct stat st;
  if (lstat(f.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return InvalidArgumentError("refusing to write " + f + ": it exists and is not a regular file");
  target->dir = Join(parts, parts.size());
  target->file = f;
  target->trusted = from;
  return Status::Ok();
}

Status WriteProfileFile(const ProfileTarget& target, const std::string& bytes) {
  std::vector<std::string> parts;
  std::string bad;
  if (target.dir.empty() || target.dir[0] != '/' || !Components(target.dir, &parts, &bad) ||
      target.trusted > parts.size())
    return InvalidArgumentError("bad directory " + target.dir);
  // Links are followed only in the trusted prefix (allowed_log_root's).
  std::vector<std::string> below(parts.begin() + static_cast<std::ptrdiff_t>(target.trusted), parts.end());
  exporter::OutputDir dir;
  if (Status s = exporter::OutputDir::OpenBelow(Join(parts, target.trusted), below, &dir); !s.ok()) return s;
  return dir.WriteBytes(target.file.substr(target.file.rfind('/') + 1), bytes);
}

}  // namespace spyglass::server
