#include "server/path_policy.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <vector>

#include "common/quote.h"
#include "export/log_dir.h"
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

// No existing component among parts[from..] may be a symlink or a
// non-directory. Sets *existing to how many leading components exist (the
// rest would be created).
Status CheckExistingDirs(const std::vector<std::string>& parts, size_t from, const std::string& what,
                         size_t* existing) {
  *existing = parts.size();
  for (size_t n = 1; n <= parts.size(); ++n) {
    std::string p = Join(parts, n);
    struct stat st;
    if ((n <= from ? stat(p.c_str(), &st) : lstat(p.c_str(), &st)) != 0) {
      if (errno == ENOENT) {
        *existing = n - 1;
        return Status::Ok();  // the rest will be created
      }
      return InvalidArgumentError(what + ": cannot inspect " + QuoteInput(p) + ": " + std::strerror(errno));
    }
    if (n <= from) continue;  // the trusted prefix (allowed_log_root) may hold links
    if (S_ISLNK(st.st_mode))
      return InvalidArgumentError(what + " goes through a symbolic link at " + QuoteInput(p) +
                                  " (refused: pass the real path, without symbolic links)");
    if (!S_ISDIR(st.st_mode)) return InvalidArgumentError(what + ": " + QuoteInput(p) + " exists and is not a directory");
  }
  return Status::Ok();
}

}  // namespace

Status HostFileStem(const std::string& host, std::string* stem) {
  std::string s = host;
  for (char& c : s)
    if (c == ':') c = '_';
  if (!exporter::IsPlainComponent(s) || s.find('\\') != std::string::npos || s.size() > 200)
    return InvalidArgumentError("host name " + QuoteInput(host) +
                                " is not usable as a file name (it must be a plain name of at most 200 bytes: no "
                                "'/', not '..')");
  *stem = s;
  return Status::Ok();
}

Status ResolveProfileFile(const std::string& repository_root, const std::string& session_id, const std::string& host,
                          const std::string& allowed_root, ProfileTarget* target) {
  const std::string what = "repository_root " + QuoteInput(repository_root);
  if (repository_root.empty()) return InvalidArgumentError("repository_root is empty");
  if (repository_root.size() >= kMaxProfilePathBytes)
    return InvalidArgumentError(what + " is too long (the profile's path must stay under " +
                                std::to_string(kMaxProfilePathBytes) + " bytes)");
  if (repository_root.find('\0') != std::string::npos) return InvalidArgumentError(what + " contains a NUL byte");
  if (repository_root[0] != '/')
    return InvalidArgumentError(what + " must be an absolute path (<log_dir>/plugins/profile)");
  std::vector<std::string> parts;
  std::string bad;
  if (!Components(repository_root, &parts, &bad))
    return InvalidArgumentError(what + " contains a '" + bad + "' component (refused)");
  if (parts.size() < 2 || parts[parts.size() - 2] != "plugins" || parts.back() != "profile")
    return InvalidArgumentError(what + " must end in plugins/profile");
  for (const std::string& c : parts)
    if (c.size() > kMaxNameBytes)
      return InvalidArgumentError(what + " has a component longer than " + std::to_string(kMaxNameBytes) +
                                  " bytes");
  if (!exporter::IsPlainComponent(session_id) || session_id.size() > kMaxNameBytes)
    return InvalidArgumentError("session_id " + QuoteInput(session_id) +
                                " must be a plain directory name of at most " + std::to_string(kMaxNameBytes) +
                                " bytes (no '/', not '..')");
  std::string stem;
  if (Status s = HostFileStem(host, &stem); !s.ok()) return s;
  size_t from = 0;
  if (!allowed_root.empty()) {
    std::vector<std::string> allowed;
    if (allowed_root[0] != '/' || !Components(allowed_root, &allowed, &bad))
      return InternalError("the server's allowed_log_root " + QuoteInput(allowed_root) +
                           " is not a clean absolute path");
    bool inside = allowed.size() <= parts.size();
    for (size_t i = 0; inside && i < allowed.size(); ++i) inside = allowed[i] == parts[i];
    if (!inside)
      return InvalidArgumentError(what + " is outside the directory this server may write to (" + allowed_root + ")");
    from = allowed.size();
  }
  parts.push_back(session_id);
  std::string f = Join(parts, parts.size()) + "/" + stem + ".xplane.pb";
  if (f.size() >= kMaxProfilePathBytes)
    return InvalidArgumentError("the profile's path under " + what + " would be " + std::to_string(f.size()) +
                                " bytes long (the limit is " + std::to_string(kMaxProfilePathBytes) + ")");
  // Only now touch the file system: at most parts.size() (bounded above) stats.
  size_t existing = 0;
  if (Status s = CheckExistingDirs(parts, from, what, &existing); !s.ok()) return s;
  if (parts.size() - existing > kMaxNewDirectories)
    return InvalidArgumentError("writing under " + what + " would create " + std::to_string(parts.size() - existing) +
                                " new directories (a request may create at most " +
                                std::to_string(kMaxNewDirectories) + ")");
  struct stat st;
  if (lstat(f.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return InvalidArgumentError("refusing to write " + QuoteInput(f) + ": it exists and is not a regular file");
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
