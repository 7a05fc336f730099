// A cgroup memory limit close to being hit, for the heap hook's snapshot
// thread: told by the kernel where it offers a notification, polled where not.
//
//   cgroup v1  an eventfd registered in cgroup.event_control for two
//              thresholds of memory.usage_in_bytes (90% and 80% of the
//              limit: the kernel signals each crossing, up or down) and for
//              memory.oom_control;
//   cgroup v2  memory.events polled for POLLPRI (the kernel notifies each
//              change of its counters: "high", "max", "oom") and a PSI trigger
//              written to the cgroup's memory.pressure (else
//              /proc/pressure/memory) polled for POLLPRI. v2 offers no
//              usage threshold: these fire when usage reaches memory.high or
//              memory.max, or when tasks stall on memory, later than 90%;
//   polling    memory usage read every 250 ms, where none of these works.
//
// The limit is the smallest of the process's cgroup and its ancestors (as
// /proc/self/cgroup names them under /sys/fs/cgroup); the usage watched is
// that cgroup's. Not for a hot path: it opens and reads files.
#pragma once

#include <poll.h>

#include <cstdint>
#include <string>

#include "common/kept_fd.h"

namespace spyglass::memory::heap {

class CgroupWatch {
 public:
  // The watch of this process's limit, or nullptr when there is none.
  // `root`: where the cgroup hierarchies are mounted (tests pass another).
  static CgroupWatch* Open(const std::string& root = "/sys/fs/cgroup");
  ~CgroupWatch();
  CgroupWatch(const CgroupWatch&) = delete;
  CgroupWatch& operator=(const CgroupWatch&) = delete;

  static constexpr int kMaxFds = 3;
  // The descriptors to poll (at most kMaxFds) and the poll timeout in ms (-1:
  // wait for events only).
  int PollFds(pollfd* out) const;
  int TimeoutMs() const { return mode_ == Mode::kPolling ? 250 : -1; }
  // After a poll of PollFds (their revents set, or a timeout): consumes the
  // events and reads the usage; true when it has just passed 90% of the limit
  // (once, until it falls below 80% again).
  bool Check(pollfd* fds, int n);

  enum class Mode { kV1Events, kV2Events, kPolling };
  Mode mode() const { return mode_; }
  // How the limit is watched, in words ("cgroup v1 eventfd: usage thresholds and oom_control", ...).
  const std::string& how() const { return how_; }
  const std::string& dir() const { return dir_; }
  uint64_t limit() const { return limit_; }
  uint64_t usage() const { return usage_; }  // at the latest Check

 private:
  CgroupWatch() = default;
  bool StartV1();
  bool StartV2();

  Mode mode_ = Mode::kPolling;
  std::string how_, dir_, usage_file_;
  uint64_t limit_ = 0, usage_ = 0;
  bool armed_ = true;
  // Kept high and checked before each poll, read or close (common/kept_fd.h):
  // the program may close them and reuse the numbers.
  kept_fd::KeptFd fds_[kMaxFds];
  short events_[kMaxFds] = {0, 0, 0};
  int nfds_ = 0;
};

}  // namespace spyglass::memory::heap
