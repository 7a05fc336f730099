// A process's memory as the kernel counts it, for the tests and
// benchmarks that measure a step's peak: VmRSS before, VmHWM after, the
// high-water mark reset in between (5 written to /proc/self/clear_refs).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace spyglass::testing {

// A kB field of /proc/<pid>/status ("VmRSS", "VmHWM"; pid 0: this
// process); -1 if absent.
inline int64_t StatusKb(const char* key, int pid = 0) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/status") : "/proc/" + std::to_string(pid) + "/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(in, line))
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':')
      return std::strtoll(line.c_str() + n + 1, nullptr, 10);
  return -1;
}
inline int64_t RssBytes() { return StatusKb("VmRSS") * 1024; }
inline int64_t PeakBytes() { return StatusKb("VmHWM") * 1024; }

// Resets VmHWM to the current RSS; false where /proc/self/clear_refs cannot
// be written (then peaks are the process's lifetime peaks).
inline bool ResetPeak() {
  int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "5", 1) == 1;
  ::close(fd);
  return ok;
}

inline double Mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace spyglass::testing
