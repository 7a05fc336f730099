// Descriptors the profiler keeps open inside the profiled program (a wake-up
// pipe, a directory, a crash file) for as long as it runs. The program owns
// its descriptor table: a daemon closes every descriptor and opens its log at
// the lowest free number, or dup2()s onto any number. So each kept descriptor
// sits high (away from the numbers programs reuse first), and its identity
// (device, inode, type) is recorded and checked before every use: a number
// that now names another file is the program's, never written, read or closed.
// Header-only and async-signal-safe checks (fstat); hidden in each library.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

namespace spyglass::kept_fd {

// Plain data (no symbols): usable as a field of an exported class.
struct KeptFd {
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;
  mode_t type = 0;  // S_IFMT bits
};

}  // namespace spyglass::kept_fd

#pragma GCC visibility push(hidden)
namespace spyglass::kept_fd {

// The lowest number a kept descriptor takes: 1024 when the limit allows (a
// daemon's classic "close 3..1023" loop leaves it), else near the limit.
inline int HighFloor() {
  struct rlimit r {};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 10;
  if (r.rlim_cur == RLIM_INFINITY || r.rlim_cur > 1024 + 64) return 1024;
  if (r.rlim_cur > 64 + 10) return static_cast<int>(r.rlim_cur) - 64;
  return 10;
}

// Takes `fd` (closed here in any case): moves it above HighFloor()
// (close-on-exec) and records what it names. fd == -1 in the result when
// that failed.
inline KeptFd Keep(int fd) {
  KeptFd k;
  if (fd < 0) return k;
  int high = fcntl(fd, F_DUPFD_CLOEXEC, HighFloor());
  if (high < 0) high = fcntl(fd, F_DUPFD_CLOEXEC, 3);  // the floor is out of range: any number will do
  close(fd);
  if (high < 0) return k;
  struct stat st {};
  if (fstat(high, &st) != 0) {
    close(high);
    return k;
  }
  k.fd = high;
  k.dev = st.st_dev;
  k.ino = st.st_ino;
  k.type = st.st_mode & S_IFMT;
  return k;
}

// Whether k.fd still names the file it was kept for. Async-signal-safe.
inline bool IsOurs(const KeptFd& k) {
  if (k.fd < 0) return false;
  struct stat st {};
  if (fstat(k.fd, &st) != 0) return false;
  return st.st_dev == k.dev && st.st_ino == k.ino && (st.st_mode & S_IFMT) == k.type;
}

// Closes k.fd only while it is still ours (else it is the program's now);
// k is reset either way.
inline void CloseIfOurs(KeptFd* k) {
  if (IsOurs(*k)) close(k->fd);
  *k = KeptFd{};
}

}  // namespace spyglass::kept_fd
#pragma GCC visibility pop
