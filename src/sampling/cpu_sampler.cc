#include "sampling/cpu_sampler.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <asm/perf_regs.h>
#endif

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "common/kept_fd.h"
#include "memory/unwind.h"

namespace spyglass::sampling {
namespace {

// A ring of 64 data pages (256 KiB): 31 samples of an 8 KiB stack copy, the
// reader woken at 4, with room for 27 more (7 ms at 4 kHz, 27 at 999 Hz: a
// reader kept off the CPU that long on a busy machine) before the kernel
// drops (and counts) samples. The kernel lets a user lock
// perf_event_mlock_kb (516 KiB) per CPU plus RLIMIT_MEMLOCK of rings: when
// that is used up, later threads get smaller rings (16, then 4 pages).
constexpr size_t kRingPages[] = {64, 16, 4};
constexpr size_t kWakeBytes = 32 * 1024;

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::string ThreadName(uint32_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(f, name);
  return name;
}

// The timer fallback's slots: written by the sampled threads' signal handler
// (claimed with a compare-and-swap: no lock, no allocation), read and freed
// by the reader. Allocated once and never freed: a signal that arrives late
// still finds them.
struct TimerSlot {
  std::atomic<uint32_t> state{0};  // 0 free, 1 being written, 2 ready
  uint32_t tid = 0;
  uint64_t time_ns = 0, ip = 0, sp = 0, bp = 0, size = 0;
  uint32_t periods = 1;  // 1 + the timer's overrun
  uint8_t stack[kStackCopyBytes];
};
constexpr size_t kTimerSlots = 512;  // 0.5 s of one thread at 999 Hz; the reader drains every kTimerDrainMs
constexpr int kTimerDrainMs = 10;
TimerSlot* g_slots = nullptr;
std::atomic<uint64_t> g_next_slot{0}, g_timer_lost{0};
std::atomic<bool> g_timer_on{false};

void OnTimerSample(int, siginfo_t* si, void* uc_void) {
  if (si->si_code != SI_TIMER || !g_timer_on.load(std::memory_order_acquire)) return;
#if defined(__x86_64__)
  const int saved_errno = errno;
  TimerSlot& s = g_slots[g_next_slot.fetch_add(1, std::memory_order_relaxed) % kTimerSlots];
  uint32_t expect = 0;
  if (!s.state.compare_exchange_strong(expect, 1, std::memory_order_acquire)) {
    g_timer_lost.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const auto* uc = static_cast<const ucontext_t*>(uc_void);
  s.tid = static_cast<uint32_t>(syscall(SYS_gettid));
  s.periods = 1 + static_cast<uint32_t>(si->si_overrun > 0 ? si->si_overrun : 0);
  s.ip = static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RIP]);
  s.sp = static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RSP]);
  s.bp = static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RBP]);
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  s.time_ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  // The stack top, copied by the kernel: a read past the stack's end stops
  // short instead of faulting (the copy is partial, the unwind truncated).
  iovec local{s.stack, kStackCopyBytes}, remote{reinterpret_cast<void*>(s.sp), kStackCopyBytes};
  const ssize_t n = syscall(SYS_process_vm_readv, getpid(), &local, 1ul, &remote, 1ul, 0ul);
  s.size = n > 0 ? static_cast<uint64_t>(n) : 0;
  s.state.store(2, std::memory_order_release);
  errno = saved_errno;
#else
  (void)uc_void;
#endif
}

// A realtime signal nobody handles, ours from then on (as python_stacks.cc's); 0 if none is free.
int ChooseTimerSignal() {
  static int chosen = 0;
  if (chosen != 0) return chosen;
  for (int sig = SIGRTMAX - 5; sig >= SIGRTMIN + 4; --sig) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;
    struct sigaction sa {};
    sa.sa_sigaction = OnTimerSample;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigfillset(&sa.sa_mask);
    if (sigaction(sig, &sa, nullptr) != 0) continue;
    chosen = sig;
    break;
  }
  return chosen;
}

}  // namespace

uint64_t MaxSampleRate() {
  std::ifstream f("/proc/sys/kernel/perf_event_max_sample_rate");
  uint64_t v = 0;
  if (f >> v && v > 0) return v;
  return 100000;
}

struct CpuSampler::Ring {
  int fd = -1;
  uint32_t tid = 0;
  void* base = nullptr;
  size_t map_bytes = 0;
  perf_event_mmap_page* meta = nullptr;
  uint8_t* data = nullptr;
  size_t data_bytes = 0;
  bool hung_up = false;
};

CpuSampler::CpuSampler(uint64_t hz, SampleMode mode) : hz_(hz), mode_(mode) {}
CpuSampler::~CpuSampler() { Stop(); }

bool CpuSampler::OpenThread(uint32_t tid, int* err) {
#if defined(__x86_64__)
  perf_event_attr a{};
  a.size = sizeof a;
  a.type = PERF_TYPE_SOFTWARE;
  // Per-thread events count only while their thread runs: task-clock is its CPU time.
  a.config = PERF_COUNT_SW_TASK_CLOCK;
  a.sample_period = period_ns_;
  a.sample_type = PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_PERIOD | PERF_SAMPLE_REGS_USER |
                  PERF_SAMPLE_STACK_USER;
  a.sample_regs_user = (1ull << PERF_REG_X86_BP) | (1ull << PERF_REG_X86_SP) | (1ull << PERF_REG_X86_IP);
  a.sample_stack_user = kStackCopyBytes;
  a.exclude_kernel = 1;  // user space only: allowed at perf_event_paranoid=2
  a.exclude_hv = 1;
  a.use_clockid = 1;
  a.clockid = CLOCK_MONOTONIC;
  a.watermark = 1;
  const long page = sysconf(_SC_PAGESIZE);
  a.wakeup_watermark = kWakeBytes;
  int fd = static_cast<int>(syscall(SYS_perf_event_open, &a, static_cast<pid_t>(tid), -1, -1, PERF_FLAG_FD_CLOEXEC));
  if (fd < 0) {
    *err = errno;
    return false;
  }
  // Away from the numbers the program reuses first (common/kept_fd.h).
  int high = fcntl(fd, F_DUPFD_CLOEXEC, kept_fd::HighFloor());
  if (high >= 0) {
    close(fd);
    fd = high;
  }
  auto r = std::make_unique<Ring>();
  r->fd = fd;
  r->tid = tid;
  r->base = MAP_FAILED;
  size_t pages = 0;
  for (size_t p : kRingPages) {
    pages = p;
    r->map_bytes = (1 + pages) * static_cast<size_t>(page);
    r->base = mmap(nullptr, r->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r->base != MAP_FAILED || errno != EPERM) break;
  }
  if (r->base == MAP_FAILED) {
    *err = errno;
    close(fd);
    return false;
  }
  r->meta = static_cast<perf_event_mmap_page*>(r->base);
  r->data = static_cast<uint8_t*>(r->base) + page;
  r->data_bytes = pages * static_cast<size_t>(page);
  // (A 4-page ring is smaller than the wake-up mark: the reader drains it at
  // its rescan interval; what does not fit is counted lost.)
  cap_.thread_names.emplace(tid, ThreadName(tid));
  if (python_on_) python_.Arm(fd, tid);
  rings_.push_back(std::move(r));
  return true;
#else
  (void)tid;
  *err = ENOSYS;
  return false;
#endif
}

bool CpuSampler::OpenTimer(uint32_t tid, int* err) {
  sigevent ev{};
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = ChooseTimerSignal();
  ev._sigev_un._tid = static_cast<pid_t>(tid);
  // The thread's CPU clock (the kernel's encoding of a thread clock id, as
  // pthread_getcpuclockid's): its timer runs only while the thread runs.
  const clockid_t clock = static_cast<clockid_t>((~static_cast<clockid_t>(tid) << 3) | 6);
  timer_t t;
  if (ev.sigev_signo == 0) {
    *err = EAGAIN;
    return false;
  }
  if (timer_create(clock, &ev, &t) != 0) {
    *err = errno;
    return false;
  }
  itimerspec its{};
  its.it_interval.tv_sec = static_cast<time_t>(period_ns_ / 1000000000ull);
  its.it_interval.tv_nsec = static_cast<long>(period_ns_ % 1000000000ull);
  its.it_value = its.it_interval;
  if (timer_settime(t, 0, &its, nullptr) != 0) {
    *err = errno;
    timer_delete(t);
    return false;
  }
  cap_.thread_names.emplace(tid, ThreadName(tid));
  timers_.emplace_back(tid, t);
  return true;
}

void CpuSampler::DrainTimerSlots() {
  if (g_slots == nullptr) return;
  for (size_t i = 0; i < kTimerSlots; ++i) {
    TimerSlot& s = g_slots[i];
    if (s.state.load(std::memory_order_acquire) != 2) continue;
    if (cap_.samples.size() >= kMaxSamples) {
      ++cap_.dropped;
    } else {
      const uint64_t t0 = MonotonicNs();
      uintptr_t frames[kMaxDepth];
      int why = 0;
      int n = memory::internal::UnwindCopiedStack(s.ip, s.sp, s.bp, s.stack, s.size, frames, kMaxDepth, &why);
      const bool truncated = why != memory::internal::kCfiOutermost;
      if (truncated) ++cap_.truncated_samples;
      // A thread CPU-clock timer expires at the scheduler tick (250 Hz
      // here): at a higher rate one signal stands for several periods (the
      // overrun), each kept as a sample of the same stack.
      const uint32_t stack = Intern(frames, n, truncated);
      for (uint32_t k = 0; k < std::min<uint32_t>(s.periods, 1000) && cap_.samples.size() < kMaxSamples; ++k)
        cap_.samples.push_back({s.time_ns, period_ns_, s.tid, stack});
      cap_.unwind_ns += MonotonicNs() - t0;
    }
    s.state.store(0, std::memory_order_release);
  }
}

Status CpuSampler::Start() {
  if (started_) return Status::Ok();
#if !defined(__x86_64__)
  return UnimplementedError("CPU sampling reads x86-64 registers; this is another architecture");
#endif
  period_ns_ = 1000000000ull / hz_;
  cap_.period_ns = period_ns_;
  scratch_.resize(64 * 1024);
  std::string python_why;
  // For tests: SPYGLASS_SAMPLER_FORCE_TIMER=1 takes the timer fallback as if perf events were refused.
  const char* force = getenv("SPYGLASS_SAMPLER_FORCE_TIMER");
  const bool force_timer = force != nullptr && force[0] == '1';
  std::string perf_refused = "SPYGLASS_SAMPLER_FORCE_TIMER=1 (testing)";
  auto open_all = [&](int* first_err) {
    size_t opened = 0;
    DIR* d = opendir("/proc/self/task");
    if (d == nullptr) return opened;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      uint32_t tid = static_cast<uint32_t>(strtoul(e->d_name, nullptr, 10));
      known_tids_[tid] = true;
      int err = 0;
      if (OpenAny(tid, &err)) ++opened;
      else {
        ++cap_.threads_unsampled;
        if (*first_err == 0) *first_err = err;
      }
    }
    closedir(d);
    return opened;
  };
  int first_err = 0;
  size_t opened = 0;
  if (!force_timer) {
    python_on_ = python_.Enable(&python_why);
    opened = open_all(&first_err);
    if (opened == 0) {
      python_.Disable();
      python_on_ = false;
      for (auto& r : rings_) munmap(r->base, r->map_bytes), close(r->fd);
      rings_.clear();
      perf_refused = std::string("perf_event_open refused (") + std::strerror(first_err) +
                     "; seccomp or perf_event_paranoid=3 forbid it)";
    }
  }
  if (opened == 0) {
    use_timer_ = true;
    known_tids_.clear();
    cap_.threads_unsampled = 0;
    cap_.thread_names.clear();
    if (g_slots == nullptr) g_slots = new TimerSlot[kTimerSlots];
    g_timer_on.store(true, std::memory_order_release);
    first_err = 0;
    opened = open_all(&first_err);
    if (opened == 0) {
      g_timer_on.store(false, std::memory_order_release);
      return UnavailableError("CPU sampling is off: " + perf_refused + ", and timer_create refused too (" +
                              std::strerror(first_err) + ")");
    }
    cap_.mechanism = "timer_create on each thread's CPU clock, signal " + std::to_string(ChooseTimerSignal()) +
                     " (SIGRTMIN+" + std::to_string(ChooseTimerSignal() - SIGRTMIN) +
                     ", taken for the process) whose handler copies the thread's registers and stack top, unwound "
                     "with .eh_frame CFI by the reader; because " + perf_refused +
                     (mode_ == SampleMode::kWall ? "; wall mode: on-CPU time only" : "") + "; no Python frames";
  }
  if (!use_timer_) cap_.mechanism = std::string("perf_event_open task-clock per thread, user stacks copied by the kernel") +
                   (python_on_ ? "" : " (no signal in the program)") +
                   ", unwound with .eh_frame CFI off the sampled threads";
  if (!use_timer_ && mode_ == SampleMode::kWall)
    cap_.mechanism += "; wall mode: on-CPU time only (a sleeping thread's user stack needs kernel-level profiling "
                      "or a signal that would interrupt its system calls)";
  if (use_timer_) {
  } else if (python_on_)
    cap_.mechanism += "; Python frames read at each sample by a handler of signal " + std::to_string(python_.signal_number()) +
                      " (SIGRTMIN+" + std::to_string(python_.signal_number() - SIGRTMIN) +
                      ", taken for the process) that each thread's event sends it";
  else if (!python_why.empty())
    cap_.mechanism += "; " + python_why;
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  // The reader takes none of the program's signals.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  std::atomic<uint32_t> reader_tid{0};
  reader_ = std::thread([this, &reader_tid] {
    reader_tid.store(static_cast<uint32_t>(syscall(SYS_gettid)));
    reader_tid.notify_one();
    ReaderLoop();
  });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  reader_tid.wait(0);
  reader_tid_ = reader_tid.load();
  started_ = true;
  return Status::Ok();
}

void CpuSampler::Rescan() {
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    uint32_t tid = static_cast<uint32_t>(strtoul(e->d_name, nullptr, 10));
    if (tid == reader_tid_ || !known_tids_.emplace(tid, true).second) continue;
    int err = 0;
    if (!OpenAny(tid, &err) && err != ESRCH && err != EINVAL) ++cap_.threads_unsampled;
  }
  closedir(d);
}

void CpuSampler::ReaderLoop() {
  known_tids_[static_cast<uint32_t>(syscall(SYS_gettid))] = true;  // never sample the reader
  std::vector<pollfd> fds;
  uint64_t last_scan = MonotonicNs(), last_full = last_scan;
  nlink_t last_nlink = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    for (auto& r : rings_) fds.push_back({r->fd, POLLIN, 0});
    int n = poll(fds.data(), fds.size(), use_timer_ ? kTimerDrainMs : kRescanIntervalMs);
    if (n > 0)
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents & (POLLHUP | POLLERR)) rings_[i - 1]->hung_up = true;
    DrainAll();
    // A thread that ended: its ring is drained, then let go.
    for (size_t i = 0; i < rings_.size();) {
      if (rings_[i]->hung_up) {
        munmap(rings_[i]->base, rings_[i]->map_bytes);
        close(rings_[i]->fd);
        rings_[i] = std::move(rings_.back());
        rings_.pop_back();
      } else {
        ++i;
      }
    }
    // New threads: /proc/self/task's link count is 2 + the number of
    // threads (one stat, a microsecond); the directory is listed when it
    // changes, and every kFullRescanMs anyway (one thread ended, another
    // started in between).
    uint64_t now = MonotonicNs();
    if (now - last_scan >= kRescanIntervalMs * 1000000ull) {
      struct stat st {};
      const bool changed = stat("/proc/self/task", &st) != 0 || st.st_nlink != last_nlink;
      if (changed || now - last_full >= kFullRescanMs * 1000000ull) {
        Rescan();
        last_full = now;
        last_nlink = st.st_nlink;
      }
      last_scan = now;
    }
  }
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  cap_.reader_cpu_ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void CpuSampler::DrainAll() {
  for (auto& r : rings_) Drain(*r);
  if (use_timer_) DrainTimerSlots();
  if (python_on_) python_.Drain();
}

void CpuSampler::Drain(Ring& r) {
  const uint64_t head = __atomic_load_n(&r.meta->data_head, __ATOMIC_ACQUIRE);
  uint64_t tail = r.meta->data_tail;
  const size_t mask = r.data_bytes - 1;
  while (tail < head) {
    perf_event_header h;
    const size_t at = tail & mask;
    // A record may wrap around the ring's end: copied out in two parts.
    auto copy = [&](uint8_t* dst, size_t off, size_t n) {
      size_t first = std::min(n, r.data_bytes - off);
      memcpy(dst, r.data + off, first);
      if (first < n) memcpy(dst + first, r.data, n - first);
    };
    copy(reinterpret_cast<uint8_t*>(&h), at, sizeof h);
    if (h.size < sizeof h || tail + h.size > head) break;
    const uint8_t* rec;
    if (at + h.size <= r.data_bytes) {
      rec = r.data + at;
    } else {
      if (scratch_.size() < h.size) scratch_.resize(h.size);
      copy(scratch_.data(), at, h.size);
      rec = scratch_.data();
    }
    if (h.type == PERF_RECORD_SAMPLE) {
      HandleSample(rec, h.size);
    } else if (h.type == PERF_RECORD_LOST && h.size >= sizeof h + 16) {
      uint64_t lost;
      memcpy(&lost, rec + sizeof h + 8, sizeof lost);
      cap_.lost += lost;
    }
    tail += h.size;
  }
  __atomic_store_n(&r.meta->data_tail, tail, __ATOMIC_RELEASE);
}

void CpuSampler::HandleSample(const uint8_t* rec, size_t size) {
  const uint8_t* p = rec + sizeof(perf_event_header);
  const uint8_t* end = rec + size;
  auto u64 = [&](uint64_t* v) {
    if (end - p < 8) return false;
    memcpy(v, p, 8);
    p += 8;
    return true;
  };
  uint64_t pid_tid = 0, time = 0, period = 0, abi = 0, bp = 0, sp = 0, ip = 0, stack_size = 0, dyn = 0;
  if (!u64(&pid_tid) || !u64(&time) || !u64(&period) || !u64(&abi)) return;
  if (abi != 0 && (!u64(&bp) || !u64(&sp) || !u64(&ip))) return;
  if (!u64(&stack_size)) return;
  const uint8_t* stack = p;
  if (stack_size > 0) {
    if (static_cast<uint64_t>(end - p) < stack_size + 8) return;
    p += stack_size;
    u64(&dyn);
  }
  if (abi == 0) return;  // no user registers: the thread was not in user space
  if (cap_.samples.size() >= kMaxSamples) {
    ++cap_.dropped;
    return;
  }
  const uint64_t t0 = MonotonicNs();
  uintptr_t frames[kMaxDepth];
  int why = 0;
  int n = memory::internal::UnwindCopiedStack(ip, sp, bp, stack, std::min(dyn, stack_size), frames, kMaxDepth, &why);
  const bool truncated = why != memory::internal::kCfiOutermost;
  if (truncated) ++cap_.truncated_samples;
  const uint32_t tid = static_cast<uint32_t>(pid_tid >> 32);
  cap_.samples.push_back({time, period, tid, Intern(frames, n, truncated)});
  cap_.unwind_ns += MonotonicNs() - t0;
}

uint32_t CpuSampler::Intern(const uintptr_t* frames, int n, bool truncated) {
  std::string key(reinterpret_cast<const char*>(frames), static_cast<size_t>(n) * sizeof(uintptr_t));
  key.push_back(truncated ? 1 : 0);
  auto [it, inserted] = stack_ids_.emplace(std::move(key), static_cast<uint32_t>(cap_.stacks.size()));
  if (inserted) {
    cap_.stacks.emplace_back(frames, frames + n);
    cap_.truncated.push_back(truncated ? 1 : 0);
  }
  return it->second;
}

void CpuSampler::Stop() {
  if (!started_ || stopped_) return;
  stopped_ = true;
  stop_.store(true, std::memory_order_release);
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  reader_.join();
  for (auto& r : rings_) ioctl(r->fd, PERF_EVENT_IOC_DISABLE, 0);
  for (auto& [tid, t] : timers_) timer_delete(static_cast<timer_t>(t));
  timers_.clear();
  if (use_timer_) {
    g_timer_on.store(false, std::memory_order_release);
    cap_.lost += g_timer_lost.exchange(0);
  }
  DrainAll();
  if (python_on_) {
    python_.Disable();
    python_.Merge(&cap_);
  }
  for (auto& r : rings_) {
    munmap(r->base, r->map_bytes);
    close(r->fd);
  }
  rings_.clear();
  close(wake_fd_);
  wake_fd_ = -1;
}

CpuCapture CpuSampler::Take() {
  CpuCapture out = std::move(cap_);
  cap_ = CpuCapture{};
  return out;
}

}  // namespace spyglass::sampling
