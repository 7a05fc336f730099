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

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "common/kept_fd.h"
#include "memory/tracker.h"
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
// Wall mode: the reader's looks at blocked threads, at most. Each costs CPU
// time that the process's CPU clocks count (a program's own ITIMER_PROF too).
constexpr uint64_t kOffCpuLookHz = 250;
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
// 2 s of one thread observed at every tick (250 Hz); the reader drains every
// kTimerDrainMs, every kTimerBusyDrainMs when the last drain found the table
// an eighth full. (Its wake-ups are CPU time the program's own ITIMER_PROF
// counts: few when idle.)
constexpr size_t kTimerSlots = 512;
constexpr int kTimerDrainMs = 50;
constexpr int kTimerBusyDrainMs = 10;
TimerSlot* g_slots = nullptr;
std::atomic<uint64_t> g_next_slot{0}, g_timer_lost{0};
std::atomic<uint64_t> g_timer_ready{0};  // slots made ready, ever: the reader scans when it moved
std::atomic<bool> g_timer_on{false};

// Where seccomp refuses process_vm_readv (Docker's default profile without
// CAP_SYS_PTRACE, as it refuses perf_event_open): /proc/self/mem, opened once
// and kept for the process's life (a handler may still run after Stop, and a
// closed number could be the program's next file).
std::atomic<int> g_mem_fd{-1};

}  // namespace

ssize_t CopyOwnMemory(void* dst, uint64_t src, size_t n) {
  iovec local{dst, n}, remote{reinterpret_cast<void*>(src), n};
  const ssize_t got = syscall(SYS_process_vm_readv, getpid(), &local, 1ul, &remote, 1ul, 0ul);
  const int fd = g_mem_fd.load(std::memory_order_relaxed);
  if (got >= 0 || fd < 0 || src > static_cast<uint64_t>(INT64_MAX)) return got;
  return pread(fd, dst, n, static_cast<off_t>(src));
}

namespace {

// Opens /proc/self/mem when process_vm_readv on this process is refused.
void PrepareOwnMemoryCopy() {
  if (g_mem_fd.load() >= 0) return;
  uint64_t probe = 0, word = 1;
  iovec local{&probe, sizeof probe}, remote{&word, sizeof word};
  if (syscall(SYS_process_vm_readv, getpid(), &local, 1ul, &remote, 1ul, 0ul) == sizeof probe) return;
  int fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  int high = fcntl(fd, F_DUPFD_CLOEXEC, kept_fd::HighFloor());
  if (high >= 0) {
    close(fd);
    fd = high;
  }
  int expect = -1;
  if (!g_mem_fd.compare_exchange_strong(expect, fd)) close(fd);
}

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
  const ssize_t n = CopyOwnMemory(s.stack, s.sp, kStackCopyBytes);
  s.size = n > 0 ? static_cast<uint64_t>(n) : 0;
  s.state.store(2, std::memory_order_release);
  g_timer_ready.fetch_add(1, std::memory_order_release);
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
  its.it_interval.tv_sec = static_cast<time_t>(timer_period_ns() / 1000000000ull);
  its.it_interval.tv_nsec = static_cast<long>(timer_period_ns() % 1000000000ull);
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

size_t CpuSampler::DrainTimerSlots(bool all) {
  if (g_slots == nullptr) return 0;
  const uint64_t ready = g_timer_ready.load(std::memory_order_acquire);
  if (!all && ready == timer_ready_seen_) return 0;  // nothing new: the 512 slots are not walked
  timer_ready_seen_ = ready;
  size_t drained = 0;
  for (size_t i = 0; i < kTimerSlots; ++i) {
    TimerSlot& s = g_slots[i];
    if (s.state.load(std::memory_order_acquire) != 2) continue;
    const uint32_t periods = std::min<uint32_t>(s.periods, 100000);
    const uint64_t samples = periods * timer_period_ns() / period_ns_;  // about: the bound's count
    if (cap_.samples.size() + off_samples_.size() + timer_obs_periods_ + samples > kMaxSamples) {
      cap_.dropped += samples;
    } else {
      const uint64_t t0 = MonotonicNs();
      uintptr_t frames[kMaxDepth];
      int why = 0;
      int n = memory::internal::UnwindCopiedStack(s.ip, s.sp, s.bp, s.stack, s.size, frames, kMaxDepth, &why);
      const bool truncated = why != memory::internal::kCfiOutermost;
      if (truncated) cap_.truncated_samples += samples;
      timer_obs_.push_back({s.time_ns, s.tid, Intern(frames, n, truncated), periods});
      timer_obs_periods_ += samples;
      cap_.unwind_ns += MonotonicNs() - t0;
    }
    s.state.store(0, std::memory_order_release);
    ++drained;
  }
  return drained;
}

// A thread CPU-clock timer is checked at the scheduler tick only (250 Hz
// here): a signal comes at the first tick that finds the thread running past
// its expiry, and its overrun says how many timer periods passed since the
// last. Weighing each observation by its own overrun credits the stack seen
// at the tick with CPU time the thread spent elsewhere before it (after a
// sleep, or a run between two ticks); at a rate below the tick's, "the first
// tick after the expiry" falls late in a run more often than early. So the
// timer is armed at kTimerArmNs, below any tick (every tick that finds the
// thread running observes it), and every observation of a thread weighs the
// same: the thread's samples at the requested rate (its CPU time, exact from
// the overruns, / the period) spread over its observations, each rounded up
// or down at random so that none beats in step with the program.
void CpuSampler::ExpandTimerObservations() {
  std::unordered_map<uint32_t, std::pair<uint64_t, uint64_t>> per_thread;  // tid -> (timer periods, observations)
  for (const TimerObservation& o : timer_obs_) {
    auto& t = per_thread[o.tid];
    t.first += o.periods;
    t.second += 1;
  }
  uint64_t rng = 0x2545f4914f6cdd1dull ^ MonotonicNs();
  for (const TimerObservation& o : timer_obs_) {
    const auto& t = per_thread[o.tid];
    const double each = static_cast<double>(t.first) * static_cast<double>(timer_period_ns()) /
                        static_cast<double>(period_ns_) / static_cast<double>(t.second);
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    const double u = static_cast<double>(rng >> 11) / 9007199254740992.0;  // [0, 1)
    const uint64_t k = static_cast<uint64_t>(each + u);
    for (uint64_t j = 0; j < k && cap_.samples.size() < kMaxSamples; ++j)
      cap_.samples.push_back({o.time_ns, period_ns_, o.tid, o.stack});
  }
  timer_obs_.clear();
  timer_obs_periods_ = 0;
}

namespace {

// The name of a blocking system call (x86-64 numbers) for the off-CPU frame.
std::string OffCpuFrameName(long nr) {
  static const std::pair<long, const char*> kNames[] = {
      {0, "read"},          {1, "write"},         {7, "poll"},          {17, "pread64"},      {19, "readv"},
      {23, "select"},       {34, "pause"},        {35, "nanosleep"},    {42, "connect"},      {43, "accept"},
      {44, "sendto"},       {45, "recvfrom"},     {46, "sendmsg"},      {47, "recvmsg"},      {61, "wait4"},
      {74, "fsync"},        {75, "fdatasync"},    {128, "rt_sigtimedwait"}, {130, "rt_sigsuspend"},
      {202, "futex"},       {230, "clock_nanosleep"}, {232, "epoll_wait"}, {247, "waitid"}, {270, "pselect6"},
      {271, "ppoll"},       {281, "epoll_pwait"}, {288, "accept4"},     {299, "recvmmsg"},    {441, "epoll_pwait2"},
      {449, "futex_waitv"}};
  if (nr < 0) return "[off CPU]";
  for (const auto& [n, name] : kNames)
    if (n == nr) return std::string("[off CPU: ") + name + "]";
  return "[off CPU: syscall " + std::to_string(nr) + "]";
}

}  // namespace

void CpuSampler::TrackOffCpu(uint32_t tid) {
  if (!wall_on_) return;
  for (const OffCpuThread& t : off_threads_)
    if (t.tid == tid) return;
  auto open_high = [](const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fd;
    // Away from the numbers the program reuses first (common/kept_fd.h).
    int high = fcntl(fd, F_DUPFD_CLOEXEC, kept_fd::HighFloor());
    if (high >= 0) {
      close(fd);
      fd = high;
    }
    return fd;
  };
  const std::string dir = "/proc/self/task/" + std::to_string(tid);
  const int fd = open_high(dir + "/syscall");
  if (fd < 0) return;
  const int sched_fd = open_high(dir + "/schedstat");
  if (sched_fd < 0) {
    close(fd);
    return;
  }
  cap_.thread_names.emplace(tid, ThreadName(tid));
  OffCpuThread t{};
  t.tid = tid;
  t.fd = fd;
  t.sched_fd = sched_fd;
  t.last_stack = 0;
  off_threads_.push_back(std::move(t));
}

void CpuSampler::SampleOffCpu(uint64_t now) {
  char text[256], again[256], sched[128];
  auto read_at_0 = [](int fd, char* buf, size_t cap) {
    const ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    return n;
  };
  for (size_t i = 0; i < off_threads_.size();) {
    OffCpuThread& t = off_threads_[i];
    const uint64_t wall = MonotonicNs();
    if (read_at_0(t.sched_fd, sched, sizeof sched) <= 0 || read_at_0(t.fd, text, sizeof text) <= 0) {
      close(t.fd);  // the thread ended
      close(t.sched_fd);
      off_threads_[i] = std::move(off_threads_.back());
      off_threads_.pop_back();
      continue;
    }
    ++i;
    char* p = sched;
    const uint64_t run = strtoull(p, &p, 10), wait = strtoull(p, &p, 10);
    if (!t.have_base) {
      t.have_base = true;
      t.wall_ns = wall;
      t.run_ns = run;
      t.wait_ns = wait;
    }
    // "running": on a CPU or waiting for one. Its schedstat lags then (the
    // kernel adds run and wait time when they end): nothing is counted until
    // a look finds it blocked, when the figures are exact.
    if (strncmp(text, "running", 7) == 0) {
      t.blocked = false;
      continue;
    }
    uint32_t stack = UINT32_MAX;
    if (t.blocked && t.last == text) {
      stack = t.last_stack;  // still in the same blocking call: the same stack
    } else {
      // "NR ARG1..ARG6 SP PC", or "-1 SP PC" (blocked outside a system call).
      char* q = text;
      const long nr = strtol(q, &q, 10);
      uint64_t words[8];
      int nwords = 0;
      while (nwords < 8) {
        char* e;
        const uint64_t v = strtoull(q, &e, 0);
        if (e == q) break;
        words[nwords++] = v;
        q = e;
      }
      if (nwords < 2) continue;
      const uint64_t sp = words[nwords - 2], pc = words[nwords - 1];
      const uint64_t t0 = MonotonicNs();
      const ssize_t got = CopyOwnMemory(scratch_.data(), sp, kStackCopyBytes);
      // Its Python frames, read without a signal (they hold still while it
      // blocks), every read a copy: it may wake and free them meanwhile.
      const void* py_code[PythonStacks::kMaxBlockedFrames];
      int py_lasti[PythonStacks::kMaxBlockedFrames];
      const int np = python_blocked_ ? python_.ReadBlocked(t.tid, CopyOwnMemory, py_code, py_lasti,
                                                           PythonStacks::kMaxBlockedFrames)
                                     : 0;
      // The copies are the blocked thread's only if it did not move
      // meanwhile (else: counted at the next look).
      if (read_at_0(t.fd, again, sizeof again) <= 0 || strcmp(text, again) != 0) continue;
      uintptr_t frames[kMaxDepth];
      int why = 0;
      frames[0] = memory::internal::SymbolicFrame(memory::internal::InternFunction(OffCpuFrameName(nr), ""), 0);
      // No rbp in /proc's view: a frame that finds its caller through rbp ends the stack (truncated).
      const int n = memory::internal::UnwindCopiedStack(pc, sp, 0, scratch_.data(),
                                                        got > 0 ? static_cast<size_t>(got) : 0, frames + 1,
                                                        kMaxDepth - 1, &why);
      const bool truncated = why != memory::internal::kCfiOutermost;
      if (np > 0) {
        uintptr_t spliced[kMaxDepth + PythonStacks::kMaxBlockedFrames];
        const int depth = python_.SpliceBlocked(CopyOwnMemory, py_code, py_lasti, np, frames, n + 1, spliced,
                                                kMaxDepth + PythonStacks::kMaxBlockedFrames);
        stack = Intern(spliced, depth, truncated);
      } else {
        stack = Intern(frames, n + 1, truncated);
      }
      cap_.unwind_ns += MonotonicNs() - t0;
    }
    t.blocked = true;
    t.last = text;
    t.last_stack = stack;
    // Blocked time since the first look, exact now; what is new since the
    // last count goes to this stack (blocks shorter than the looks' interval
    // that ended unseen go to the next block seen).
    const uint64_t spent = (run - t.run_ns) + (wait - t.wait_ns);
    const uint64_t blocked_total = wall - t.wall_ns > spent ? wall - t.wall_ns - spent : 0;
    if (blocked_total <= t.counted_ns) continue;
    t.owed_ns += blocked_total - t.counted_ns;
    t.counted_ns = blocked_total;
    const uint64_t k = t.owed_ns / period_ns_;
    if (k == 0) continue;
    t.owed_ns -= k * period_ns_;
    if (cap_.samples.size() + off_samples_.size() + timer_obs_periods_ + k > kMaxSamples) {
      cap_.dropped += k;
      continue;
    }
    if (cap_.truncated[stack]) cap_.truncated_samples += k;
    for (uint64_t j = k; j-- > 0;) off_samples_.push_back({now - j * period_ns_, period_ns_, t.tid, stack});
    cap_.off_cpu_samples += k;
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
  if (mode_ == SampleMode::kWall) {
    // Off-CPU samples read /proc/self/task/<tid>/syscall: the kernel shows a
    // blocked thread's user sp and pc there to its own process (no ptrace,
    // any perf_event_paranoid); absent without CONFIG_HAVE_ARCH_TRACEHOOK.
    const std::string probe = "/proc/self/task/" + std::to_string(syscall(SYS_gettid)) + "/syscall";
    const int fd = open(probe.c_str(), O_RDONLY | O_CLOEXEC);
    char buf[256];
    if (fd >= 0 && pread(fd, buf, sizeof buf, 0) > 0) {
      wall_on_ = true;
      PrepareOwnMemoryCopy();
    }
    else
      wall_why_ = "wall mode samples threads while they run only: " + probe + " cannot be read (" +
                  std::strerror(errno) + "), and a sleeping thread's user stack is out of reach otherwise without "
                  "a signal that would interrupt its system calls";
    if (fd >= 0) close(fd);
  }
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
    PrepareOwnMemoryCopy();
    g_timer_on.store(true, std::memory_order_release);
    first_err = 0;
    opened = open_all(&first_err);
    if (opened == 0) {
      g_timer_on.store(false, std::memory_order_release);
      for (const OffCpuThread& t : off_threads_) close(t.fd);
      off_threads_.clear();
      return UnavailableError("CPU sampling is off: " + perf_refused + ", and timer_create refused too (" +
                              std::strerror(first_err) + ")");
    }
    cap_.mechanism = "timer_create on each thread's CPU clock, signal " + std::to_string(ChooseTimerSignal()) +
                     " (SIGRTMIN+" + std::to_string(ChooseTimerSignal() - SIGRTMIN) +
                     ", taken for the process) whose handler copies the thread's registers and stack top, unwound "
                     "with .eh_frame CFI by the reader, at most one observation per scheduler tick; because " +
                     perf_refused + "; no Python frames";
  } else {
    cap_.mechanism = std::string("perf_event_open task-clock per thread, user stacks copied by the kernel") +
                     (python_on_ ? "" : " (no signal in the program)") +
                     ", unwound with .eh_frame CFI off the sampled threads";
  }
  if (wall_on_)
    cap_.mechanism += "; wall mode: threads blocked in the kernel sampled every period of wall time from "
                      "/proc/self/task/<tid>/syscall (user sp, pc) and a copy of their stack, no signal sent";
  else if (mode_ == SampleMode::kWall)
    cap_.mechanism += "; " + wall_why_;
  if (use_timer_) {
  } else if (python_on_)
    cap_.mechanism += "; Python frames read at each sample by a handler of signal " + std::to_string(python_.signal_number()) +
                      " (SIGRTMIN+" + std::to_string(python_.signal_number() - SIGRTMIN) +
                      ", taken for the process) that each thread's event sends it";
  else if (!python_why.empty())
    cap_.mechanism += "; " + python_why;
  // Off-CPU samples' Python frames: read by the reader, no signal needed (the timer path too).
  if (wall_on_ && use_timer_ && !python_.blocked_ready()) {
    std::string why;
    python_.Enable(&why, /*with_signal=*/false);
  }
  python_blocked_ = wall_on_ && python_.blocked_ready();
  if (wall_on_ && python_blocked_)
    cap_.mechanism += "; off-CPU samples' Python frames read from the blocked thread's state by copies, no signal";
  if (wall_on_) next_off_ns_ = MonotonicNs();
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
  std::vector<uint32_t> live;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    uint32_t tid = static_cast<uint32_t>(strtoul(e->d_name, nullptr, 10));
    live.push_back(tid);
    if (tid == reader_tid_ || !known_tids_.emplace(tid, true).second) continue;
    int err = 0;
    if (!OpenAny(tid, &err) && err != ESRCH && err != EINVAL) ++cap_.threads_unsampled;
  }
  closedir(d);
  // The timers of threads that ended: each holds a queued-signal slot
  // (RLIMIT_SIGPENDING) the program may need; deleted.
  std::sort(live.begin(), live.end());
  for (size_t i = 0; i < timers_.size();) {
    if (!std::binary_search(live.begin(), live.end(), timers_[i].first)) {
      timer_delete(static_cast<timer_t>(timers_[i].second));
      timers_[i] = timers_.back();
      timers_.pop_back();
    } else {
      ++i;
    }
  }
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
    uint64_t wait_ns = (use_timer_ ? (timer_busy_ ? kTimerBusyDrainMs : kTimerDrainMs) : kRescanIntervalMs) * 1000000ull;
    if (wall_on_) {
      const uint64_t now = MonotonicNs();
      wait_ns = std::min(wait_ns, next_off_ns_ > now ? next_off_ns_ - now : 0);
    }
    const timespec timeout{static_cast<time_t>(wait_ns / 1000000000ull), static_cast<long>(wait_ns % 1000000000ull)};
    int n = ppoll(fds.data(), fds.size(), &timeout, nullptr);
    if (n > 0)
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents & (POLLHUP | POLLERR)) rings_[i - 1]->hung_up = true;
    DrainAll();
    if (wall_on_) {
      const uint64_t now = MonotonicNs();
      if (now >= next_off_ns_) {
        SampleOffCpu(now);
        // The next look in 0.5 to 1.5 periods: instants that cannot beat in
        // step with the program's own periodic sleeps (each weighs the time
        // since the last).
        jitter_state_ ^= jitter_state_ << 13;
        jitter_state_ ^= jitter_state_ >> 7;
        jitter_state_ ^= jitter_state_ << 17;
        // At most kOffCpuLookHz looks a second: the weights are exact
        // whatever the looks' rate, which only sets how short a block gets
        // its own stack.
        const uint64_t look_ns = std::max<uint64_t>(period_ns_, 1000000000ull / kOffCpuLookHz);
        next_off_ns_ = now + look_ns / 2 + jitter_state_ % look_ns;
      }
    }
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
  if (use_timer_) timer_busy_ = DrainTimerSlots(stop_.load(std::memory_order_acquire)) > kTimerSlots / 8;
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
  if (use_timer_) ExpandTimerObservations();
  // Off-CPU samples join after the Python frames were matched to the on-CPU ones.
  cap_.samples.insert(cap_.samples.end(), off_samples_.begin(), off_samples_.end());
  off_samples_.clear();
  for (const OffCpuThread& t : off_threads_) close(t.fd), close(t.sched_fd);
  off_threads_.clear();
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
