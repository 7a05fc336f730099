#include "model/profile_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <mutex>
#include <cstring>

#include "common/quote.h"

namespace spyglass::model {

Status TooLarge(const std::string& what, uint64_t size, uint64_t max_bytes) {
  return InvalidArgumentError(what + " is too large: " + std::to_string(size) + " bytes exceed the limit of " +
                              std::to_string(max_bytes) + " bytes");
}

namespace {

// The guarded mappings, for the SIGBUS handler: a slot is claimed (used),
// then filled (end, then begin); the handler reads begin, then end.
struct Guard {
  std::atomic<bool> used{false};
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<bool> faulted{false};
};
constexpr size_t kGuards = 64;
Guard g_guards[kGuards];
struct sigaction g_previous;  // the handler before ours, set once before ours goes in
uintptr_t g_page = 4096;

void CallPrevious(int sig, siginfo_t* info, void* context) {
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler == SIG_IGN) {
    if (info->si_code <= 0) return;  // sent, not a fault: ignored as before
  } else if (g_previous.sa_handler != SIG_DFL) {
    return g_previous.sa_handler(sig);
  }
  // The default action: a fault recurs when the handler returns, a sent
  // signal is pending until then.
  signal(sig, SIG_DFL);
  if (info->si_code <= 0) raise(sig);
}

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Guard& g : g_guards) {
    uintptr_t begin = g.begin.load(std::memory_order_acquire), end = g.end.load(std::memory_order_acquire);
    if (begin == 0 || at < begin || at >= end) continue;
    // The file ends before this page now: zeros from here to the mapping's
    // end (one call, not one fault per page), and the reader fails.
    uintptr_t page = at & ~(g_page - 1);
    void* m = mmap(reinterpret_cast<void*>(page), end - page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                   -1, 0);
    if (m == MAP_FAILED) break;
    g.faulted.store(true, std::memory_order_release);
    return;
  }
  CallPrevious(sig, info, context);
}

void InstallHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous);
  });
}

Guard* FindGuard(const void* begin) {
  if (begin == nullptr) return nullptr;
  for (Guard& g : g_guards)
    if (g.begin.load(std::memory_order_acquire) == reinterpret_cast<uintptr_t>(begin)) return &g;
  return nullptr;
}

// Guards [data, data + size); false when all slots are taken (then unguarded).
bool GuardMapping(const char* data, size_t size) {
  InstallHandler();
  for (Guard& g : g_guards) {
    if (g.used.exchange(true, std::memory_order_acq_rel)) continue;
    g.faulted.store(false, std::memory_order_relaxed);
    g.end.store(reinterpret_cast<uintptr_t>(data) + size, std::memory_order_release);
    g.begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_release);
    return true;
  }
  return false;
}

// What a path that is not a regular file is, for the message.
const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "something else";
}

}  // namespace

bool FileChanged(std::string_view mapped) {
  Guard* g = FindGuard(mapped.data());
  return g != nullptr && g->faulted.load(std::memory_order_acquire);
}

Status FileChangedError(const std::string& path) {
  return InvalidArgumentError(QuoteInput(path) +
                              " changed while it was read (truncated by another process?): read it again when it is "
                              "complete");
}

void UnmapFile(std::string_view mapped) {
  if (mapped.empty()) return;
  if (Guard* g = FindGuard(mapped.data())) {
    g->begin.store(0, std::memory_order_release);
    g->end.store(0, std::memory_order_release);
    g->used.store(false, std::memory_order_release);
  }
  munmap(const_cast<char*>(mapped.data()), mapped.size());
}

MappedFile::~MappedFile() { UnmapFile(Release()); }

std::string_view MappedFile::Release() {
  std::string_view out = bytes();
  data_ = nullptr;
  size_ = 0;
  return out;
}

Status MappedFile::Open(const std::string& path, uint64_t max_bytes) {
  UnmapFile(Release());
  const std::string quoted = QuoteInput(path);
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer, for
  // ever; on a regular file it changes nothing. Symbolic links are followed.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return NotFoundError("cannot open " + quoted + ": " + std::strerror(errno));
  struct stat st {};
  Status s;
  if (fstat(fd, &st) != 0) {
    s = InvalidArgumentError("cannot stat " + quoted + ": " + std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    s = InvalidArgumentError(quoted + " is not a regular file but " + KindOf(st.st_mode) +
                             ": a profile is read from a file (copy it to one first)");
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    s = TooLarge(quoted, static_cast<uint64_t>(st.st_size), max_bytes);
  } else if (st.st_size > 0) {
    void* m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      s = InternalError("cannot map " + quoted + ": " + std::strerror(errno));
    } else {
      madvise(m, static_cast<size_t>(st.st_size), MADV_SEQUENTIAL);  // read front to back
      data_ = static_cast<const char*>(m);
      size_ = static_cast<size_t>(st.st_size);
      GuardMapping(data_, size_);
    }
  }
  ::close(fd);
  return s;
}

}  // namespace spyglass::model
