#include "export/log_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <utility>

namespace spyglass::exporter {
namespace {

// Attempts per MakeRunDir call when other processes took the names; the next
// call continues where this one stopped.
constexpr uint64_t kRunNameTriesPerCall = 1 << 20;
// Profile directories whose next suffix is remembered within one second.
constexpr size_t kRememberedDirs = 1024;

}  // namespace

std::string TimestampRunName() {
  time_t now = time(nullptr);
  struct tm tm;
  localtime_r(&now, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%Y_%m_%d_%H_%M_%S", &tm);
  return buf;
}

std::string SanitizeHostForFile(const std::string& host) {
  std::string out = host;
  for (char& c : out)
    if (c == ':' || c == '/' || c == '\\') c = '_';
  if (out.empty() || out == "." || out == "..") out = "localhost";
  return out;
}

Status MakeRunDir(const std::string& log_dir, const std::string& session_id, RunDir* run) {
  *run = RunDir{};
  if (log_dir.empty()) return InvalidArgumentError("log_dir is empty");
  if (!session_id.empty() && !IsPlainComponent(session_id))
    return InvalidArgumentError("session_id '" + session_id.substr(0, 80) + "' must be a plain directory name");
  OutputDir profile;
  if (Status s = OutputDir::OpenBelow(log_dir, {"plugins", "profile"}, &profile, &run->created); !s.ok()) return s;
  if (!session_id.empty()) return profile.OpenSubdir(session_id, &run->dir, &run->created);

  // The suffix of the next run named `base` in each profile directory this
  // process used this second: two runs in the same second (here or in
  // another process) get distinct names, and many runs in one second do not
  // retry every name taken before. Forgotten when the second changes.
  struct stat st;
  if (::fstat(profile.fd(), &st) != 0)
    return InternalError("cannot inspect " + profile.path() + ": " + std::strerror(errno));
  // Never destroyed: the flight recorder's last window is written from an
  // atexit handler, which may run after this function's statics are gone.
  struct Naming {
    std::mutex mu;
    std::string last_base;
    std::map<std::pair<dev_t, ino_t>, uint64_t> next_suffix;
  };
  static Naming* naming = new Naming;
  std::mutex& mu = naming->mu;
  std::string& last_base = naming->last_base;
  auto& next_suffix = naming->next_suffix;
  std::lock_guard<std::mutex> lock(mu);
  std::string base = TimestampRunName();
  if (base != last_base || next_suffix.size() >= kRememberedDirs) {
    last_base = base;
    next_suffix.clear();
  }
  uint64_t& next = next_suffix[{st.st_dev, st.st_ino}];
  for (uint64_t tries = 0; tries < kRunNameTriesPerCall; ++tries) {
    std::string name = next == 0 ? base : base + "_" + std::to_string(next);
    ++next;
    Status s = profile.MakeSubdir(name, &run->dir, &run->created);
    if (s.code() != StatusCode::kAlreadyExists) return s;
  }
  return InternalError("cannot name a new run " + base + "_<n> under " + profile.path() + ": " +
                       std::to_string(kRunNameTriesPerCall) + " names in a row are taken");
}

Status MakeRunDir(const std::string& log_dir, const std::string& session_id, std::string* run_dir) {
  RunDir run;
  if (Status s = MakeRunDir(log_dir, session_id, &run); !s.ok()) return s;
  *run_dir = run.dir.path();
  return Status::Ok();
}

void RemoveIfEmpty(const RunDir& run) {
  for (auto it = run.created.rbegin(); it != run.created.rend(); ++it)
    if (::rmdir(it->c_str()) != 0) break;  // not empty (or gone): leave it and what holds it
}

}  // namespace spyglass::exporter
