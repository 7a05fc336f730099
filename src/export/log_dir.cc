#include "export/log_dir.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

namespace spyglass::exporter {

namespace fs = std::filesystem;

std::string TimestampRunName() {
  time_t now = time(nullptr);
  struct tm tm;
  localtime_r(&now, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%Y_%m_%d_%H_%M_%S", &tm);
  return buf;
}

bool IsPlainComponent(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

std::string SanitizeHostForFile(const std::string& host) {
  std::string out = host;
  for (char& c : out)
    if (c == ':' || c == '/' || c == '\\') c = '_';
  if (out.empty() || out == "." || out == "..") out = "localhost";
  return out;
}

Status MakeRunDir(const std::string& log_dir, const std::string& session_id, std::string* run_dir) {
  if (log_dir.empty()) return InvalidArgumentError("log_dir is empty");
  if (!session_id.empty() && !IsPlainComponent(session_id))
    return InvalidArgumentError("session_id '" + session_id + "' must be a plain directory name");
  fs::path root = fs::path(log_dir) / "plugins" / "profile";
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return InternalError("cannot create " + root.string() + ": " + ec.message());
  if (!session_id.empty()) {
    fs::path dir = root / session_id;
    fs::create_directories(dir, ec);
    if (ec) return InternalError("cannot create " + dir.string() + ": " + ec.message());
    *run_dir = dir.string();
    return Status::Ok();
  }
  std::string base = TimestampRunName();
  for (int i = 0; i < 1000; ++i) {
    fs::path dir = root / (i == 0 ? base : base + "_" + std::to_string(i));
    // mkdir, not create_directories: it fails if the directory exists, which is
    // how two runs in the same second get distinct names.
    if (::mkdir(dir.c_str(), 0755) == 0) {
      *run_dir = dir.string();
      return Status::Ok();
    }
    if (errno != EEXIST) return InternalError("cannot create " + dir.string() + ": " + std::strerror(errno));
  }
  return InternalError("too many runs named " + base + " under " + root.string());
}

}  // namespace spyglass::exporter
