// Output for code that runs in a dying process (a fatal signal's handler, an
// allocation that failed): async-signal-safe, so no lock, no allocation, no
// stdio; write(2) from memory reserved beforehand. The two crash writers use
// it: the memory dump (memory/crash_dump.cc) and the flight recorder's ring
// (trace/crash_dump.cc). Header-only: libspyglass_memory and libspyglass each
// carry a copy, hidden in both.
#pragma once

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#pragma GCC visibility push(hidden)
namespace spyglass::signal_safe {

// Buffered writes to a file descriptor through the caller's buffer (static
// storage). Without a buffer it only counts the bytes (a sizing pass). A
// failed write sticks: what follows is dropped and failed() says so.
class FdWriter {
 public:
  FdWriter() = default;
  FdWriter(int fd, char* buf, size_t cap) : fd_(fd), buf_(buf), cap_(cap) {}

  void Put(const void* p, size_t len) {
    count_ += len;
    if (buf_ == nullptr) return;
    const char* c = static_cast<const char*>(p);
    while (len > 0) {
      if (used_ == cap_) Flush();
      size_t k = len < cap_ - used_ ? len : cap_ - used_;
      std::memcpy(buf_ + used_, c, k);
      used_ += k;
      c += k;
      len -= k;
    }
  }
  void Flush() {
    size_t off = 0;
    while (off < used_ && !failed_) {
      ssize_t w = write(fd_, buf_ + off, used_ - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) failed_ = true;
      else off += static_cast<size_t>(w);
    }
    used_ = 0;
  }
  int fd() const { return fd_; }
  uint64_t count() const { return count_; }  // bytes put, written or not
  bool failed() const { return failed_; }

 private:
  int fd_ = -1;
  char* buf_ = nullptr;
  size_t cap_ = 0, used_ = 0;
  uint64_t count_ = 0;
  bool failed_ = false;
};

// read(2), again when a signal interrupts it.
inline ssize_t Read(int fd, void* buf, size_t len) {
  while (true) {
    ssize_t r = read(fd, buf, len);
    if (r >= 0 || errno != EINTR) return r;
  }
}

// Text into a fixed buffer (not NUL-terminated), cut at its capacity.
struct Text {
  char* out;
  size_t cap;
  size_t len = 0;

  void Add(const char* s, size_t n) {
    for (size_t i = 0; i < n && len < cap; ++i) out[len++] = s[i];
  }
  void Add(const char* s) { Add(s, std::strlen(s)); }
  void AddDecimal(uint64_t v) {
    char digits[20];
    int d = 0;
    do {
      digits[d++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (d > 0) Add(&digits[--d], 1);
  }
};

inline uint64_t ClockNs(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// The end of a fatal-signal handler that let the signal's disposition go back
// to what it was (SA_RESETHAND, or the previous handler restored): a fault the
// kernel raised recurs when the faulting instruction is retried on return; any
// other signal (kill, raise, abort) is raised again.
inline void ReraiseUnlessFault(int sig, const siginfo_t* info) {
  bool fault = (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL) && info && info->si_code > 0;
  if (!fault) raise(sig);
}

}  // namespace spyglass::signal_safe
#pragma GCC visibility pop
