#include "memory/cgroup_watch.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace spyglass::memory::heap {
namespace {

// A number at the start of a file ("max", v2's no limit, is none).
bool ReadNumber(const std::string& path, uint64_t* v) {
  FILE* f = std::fopen(path.c_str(), "re");
  if (!f) return false;
  unsigned long long x = 0;
  bool ok = std::fscanf(f, "%llu", &x) == 1;
  std::fclose(f);
  *v = x;
  return ok;
}

bool WriteText(int fd, const std::string& text) {
  // PSI triggers are read with their terminating NUL; event_control ignores it.
  ssize_t n = write(fd, text.c_str(), text.size() + 1);
  return n == static_cast<ssize_t>(text.size() + 1);
}

// "/a/b" -> "/a", "/a" -> "/", "/" -> "".
std::string Parent(const std::string& p) {
  if (p.empty() || p == "/") return "";
  size_t slash = p.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash);
}

constexpr uint64_t kNoLimit = uint64_t{1} << 60;

// Whether fd is a file of that file system: a plain file accepts the writes
// that register events (a copied tree, a test's fake one) and never notifies.
constexpr long kCgroupMagic = 0x27e0eb, kCgroup2Magic = 0x63677270, kProcMagic = 0x9fa0;
bool On(int fd, long magic) {
  struct statfs st {};
  return fd >= 0 && fstatfs(fd, &st) == 0 && static_cast<long>(st.f_type) == magic;
}

// The cgroup with the smallest limit, from `path` up to the hierarchy's root
// under `mount`: its directory, or "" when none has a limit.
std::string SmallestLimit(const std::string& mount, std::string path, const char* limit_file, uint64_t* limit) {
  std::string best;
  *limit = kNoLimit;
  for (int depth = 0; !path.empty() && depth < 64; ++depth, path = Parent(path)) {
    std::string dir = mount + (path == "/" ? "" : path);
    uint64_t v = 0;
    if (ReadNumber(dir + "/" + limit_file, &v) && v > 0 && v < *limit) {
      *limit = v;
      best = dir;
    }
  }
  return best;
}

}  // namespace

CgroupWatch* CgroupWatch::Open(const std::string& root) {
  FILE* f = std::fopen("/proc/self/cgroup", "re");
  if (!f) return nullptr;
  char line[1024];
  std::string v1, v2;
  bool has_v2 = false;
  while (std::fgets(line, sizeof line, f)) {
    std::string l(line);
    if (!l.empty() && l.back() == '\n') l.pop_back();
    // id:controllers:path
    size_t a = l.find(':'), b = a == std::string::npos ? a : l.find(':', a + 1);
    if (b == std::string::npos) continue;
    std::string controllers = "," + l.substr(a + 1, b - a - 1) + ",", path = l.substr(b + 1);
    if (controllers == ",," && l.compare(0, a, "0") == 0) v2 = path, has_v2 = true;
    if (controllers.find(",memory,") != std::string::npos) v1 = path;
  }
  std::fclose(f);
  auto* w = new CgroupWatch;
  uint64_t limit = kNoLimit;
  bool is_v1 = false;
  if (!v1.empty()) {
    w->dir_ = SmallestLimit(root + "/memory", v1, "memory.limit_in_bytes", &limit);
    w->usage_file_ = w->dir_ + "/memory.usage_in_bytes";
    is_v1 = !w->dir_.empty();
  }
  if (w->dir_.empty() && has_v2) {
    // Pure v2 at the root, or hybrid (memory in v2 under "unified").
    for (const char* m : {"", "/unified"}) {
      w->dir_ = SmallestLimit(root + m, v2, "memory.max", &limit);
      if (!w->dir_.empty()) break;
    }
    w->usage_file_ = w->dir_ + "/memory.current";
  }
  w->limit_ = limit;
  if (w->dir_.empty() || !ReadNumber(w->usage_file_, &w->usage_)) {
    delete w;
    return nullptr;
  }
  if (!(is_v1 ? w->StartV1() : w->StartV2())) {
    w->mode_ = Mode::kPolling;
    w->how_ = "polling its usage every 250 ms";
  }
  return w;
}

CgroupWatch::~CgroupWatch() {
  for (int i = 0; i < nfds_; ++i) kept_fd::CloseIfOurs(&fds_[i]);
}

bool CgroupWatch::StartV1() {
  // One eventfd for every registration: any of them wakes the thread, which
  // then reads the usage. A registration lasts while the eventfd is open.
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  int ctl = open((dir_ + "/cgroup.event_control").c_str(), O_WRONLY | O_CLOEXEC);
  int usage = open(usage_file_.c_str(), O_RDONLY | O_CLOEXEC);
  int oom = open((dir_ + "/memory.oom_control").c_str(), O_RDONLY | O_CLOEXEC);
  bool ok = efd >= 0 && On(ctl, kCgroupMagic) && usage >= 0;
  for (uint64_t threshold : {limit_ / 10 * 9, limit_ / 10 * 8})
    ok = ok && WriteText(ctl, std::to_string(efd) + " " + std::to_string(usage) + " " + std::to_string(threshold));
  bool oom_ok = ok && oom >= 0 && WriteText(ctl, std::to_string(efd) + " " + std::to_string(oom));
  if (ctl >= 0) close(ctl);
  if (usage >= 0) close(usage);  // the registration holds the file
  if (oom >= 0) close(oom);
  if (!ok) {
    if (efd >= 0) close(efd);
    return false;
  }
  fds_[0] = kept_fd::Keep(efd);  // the registration holds the eventfd, not its number
  if (fds_[0].fd < 0) return false;
  events_[0] = POLLIN;
  nfds_ = 1;
  mode_ = Mode::kV1Events;
  how_ = std::string("cgroup v1 eventfd: usage thresholds") + (oom_ok ? " and oom_control" : "");
  return true;
}

bool CgroupWatch::StartV2() {
  // memory.events: the kernel notifies (POLLPRI) each change of its counters.
  int events = open((dir_ + "/memory.events").c_str(), O_RDONLY | O_CLOEXEC);
  if (events >= 0 && !On(events, kCgroup2Magic)) {
    close(events);
    events = -1;
  }
  if (events >= 0) {
    fds_[nfds_] = kept_fd::Keep(events);
    events = fds_[nfds_].fd;
    if (events >= 0) events_[nfds_++] = POLLPRI;
  }
  // A PSI trigger: tasks stalled on memory 150 ms within 2 s (the
  // cgroup's own pressure; else the system's, which includes it).
  std::string psi;
  for (std::string p : {dir_ + "/memory.pressure", std::string("/proc/pressure/memory")}) {
    int fd = open(p.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    const bool proc = p.compare(0, 6, "/proc/") == 0;
    if (On(fd, proc ? kProcMagic : kCgroup2Magic) && WriteText(fd, "some 150000 2000000")) {
      fds_[nfds_] = kept_fd::Keep(fd);  // the trigger belongs to the open file, not its number
      if (fds_[nfds_].fd < 0) continue;
      events_[nfds_++] = POLLPRI;
      psi = proc ? p : "memory.pressure";
      break;
    }
    close(fd);
  }
  if (nfds_ == 0) return false;
  mode_ = Mode::kV2Events;
  how_ = "cgroup v2 POLLPRI: ";
  if (events >= 0) how_ += "memory.events";
  if (events >= 0 && !psi.empty()) how_ += " and ";
  if (!psi.empty()) how_ += "a PSI trigger on " + psi;
  return true;
}

int CgroupWatch::PollFds(pollfd* out) const {
  // One the program took over is not polled (nor read).
  for (int i = 0; i < nfds_; ++i) out[i] = {kept_fd::IsOurs(fds_[i]) ? fds_[i].fd : -1, events_[i], 0};
  return nfds_;
}

bool CgroupWatch::Check(pollfd* fds, int n) {
  for (int i = 0; i < n && i < nfds_; ++i) {
    if (!fds[i].revents || !kept_fd::IsOurs(fds_[i])) continue;
    if (mode_ == Mode::kV1Events) {
      uint64_t count;
      ssize_t r = read(fds[i].fd, &count, sizeof count);  // resets the eventfd
      (void)r;
    } else {
      // memory.events: read, so that its next change notifies again (a PSI
      // trigger's poll consumed its event already; reading it is harmless).
      char buf[512];
      ssize_t r = pread(fds[i].fd, buf, sizeof buf, 0);
      (void)r;
    }
  }
  if (!ReadNumber(usage_file_, &usage_)) return false;
  if (armed_ && usage_ >= limit_ / 10 * 9) {
    armed_ = false;
    return true;
  }
  if (!armed_ && usage_ < limit_ / 10 * 8) armed_ = true;
  return false;
}

}  // namespace spyglass::memory::heap
