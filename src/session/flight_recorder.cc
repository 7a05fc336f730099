// Flight recorder triggers: a dump thread woken through a pipe (by the dump
// signal's handler and by slow steps, both async-signal-safe: one write()),
// and the crash handler, which writes the ring itself (trace/crash_dump.h).
#include "session/flight_recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>

#include "common/clock.h"
#include "common/signal_safe.h"
#include "export/log_dir.h"
#include "export/output_file.h"
#include "session/session.h"
#include "spyglass/profiler.h"
#include "trace/crash_dump.h"
#include "trace/recorder.h"

namespace spyglass::internal {

// The pipe the dump thread reads; -1 when no flight recorder runs.
std::atomic<int> g_dump_wake_fd{-1};

void step_was_slow() {
  int fd = g_dump_wake_fd.load(std::memory_order_relaxed);
  if (fd >= 0) (void)!write(fd, "t", 1);  // non-blocking: a full pipe has a dump pending already
}

}  // namespace spyglass::internal

namespace spyglass::session {
namespace {

constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

struct Triggers {
  std::mutex mu;  // start/stop
  std::thread thread;
  int wake[2] = {-1, -1};
  int dump_signal = 0;
  struct sigaction old_dump_action {};
  bool crash_installed = false;
  struct sigaction old_fatal[std::size(kFatalSignals)] {};
  internal::CrashTarget crash;
};

Triggers& triggers() {
  static auto* t = new Triggers;
  return *t;
}

std::atomic<bool> g_crash_entered{false};

void OnFatalSignal(int sig, siginfo_t* info, void*);
void OnDumpSignal(int);

// Gives back the fatal signals' dispositions from before the recorder. At
// stop (only_ours) a signal whose handler the program replaced meanwhile
// keeps the program's handler; at a crash every one goes back, so that the
// re-raised signal ends the process as it would have.
void RestoreFatalHandlers(bool only_ours) {
  Triggers& t = triggers();
  for (size_t i = 0; i < std::size(kFatalSignals); ++i) {
    struct sigaction now {};
    if (only_ours && (sigaction(kFatalSignals[i], nullptr, &now) != 0 || !(now.sa_flags & SA_SIGINFO) ||
                      now.sa_sigaction != OnFatalSignal))
      continue;
    sigaction(kFatalSignals[i], &t.old_fatal[i], nullptr);
  }
}

// The dump signal's disposition from before the recorder, unless the
// program installed its own meanwhile.
void RestoreDumpSignal() {
  Triggers& t = triggers();
  struct sigaction now {};
  if (sigaction(t.dump_signal, nullptr, &now) == 0 && !(now.sa_flags & SA_SIGINFO) && now.sa_handler == OnDumpSignal)
    sigaction(t.dump_signal, &t.old_dump_action, nullptr);
}

void OnDumpSignal(int) {
  int saved = errno;
  int fd = internal::g_dump_wake_fd.load(std::memory_order_relaxed);
  if (fd >= 0) (void)!write(fd, "s", 1);
  errno = saved;
}

// A fatal signal: write the ring once, then give the signal to whoever
// handled it before (or the default action), so the process dies as it
// would have.
void OnFatalSignal(int sig, siginfo_t* info, void*) {
  RestoreFatalHandlers(/*only_ours=*/false);  // a fault in here, or the re-raise, goes to the previous handler
  if (!g_crash_entered.exchange(true)) {
    Triggers& t = triggers();
    // Stop recording: threads still running add nothing more to the ring.
    uint64_t word = internal::g_state.session_word.load(std::memory_order_relaxed);
    internal::g_state.session_word.store(word & ~uint64_t{0xff}, std::memory_order_relaxed);
    internal::WriteCrashRun(t.crash, sig);
  }
  signal_safe::ReraiseUnlessFault(sig, info);
}

void DumpThread(int fd, uint64_t seconds) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point last_slow_dump{};
  bool slow_dumped = false;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    char buf[64];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n == 0) return;  // the write end closed: stop
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return;
    }
    bool by_signal = std::memchr(buf, 's', n) != nullptr;
    bool by_step = std::memchr(buf, 't', n) != nullptr;
    if (!by_signal && by_step) {
      // Slow steps dump at most once per window: one dump holds them all.
      auto now = Clock::now();
      if (slow_dumped && now - last_slow_dump < std::chrono::seconds(seconds)) continue;
      slow_dumped = true;
      last_slow_dump = now;
    }
    Status s = profiler::dump_flight_recorder("");
    const char* why = by_signal ? "signal" : "slow step";
    if (s.ok())
      std::fprintf(stderr, "spyglass: flight recorder dumped (%s) to %s\n", why,
                   profiler::last_trace_files().run_dir.c_str());
    else
      std::fprintf(stderr, "spyglass: flight recorder dump (%s) failed: %s\n", why, s.ToString().c_str());
  }
}

// Opens <log_dir>/plugins/profile and makes the crash file there now, while
// allocating is allowed.
Status PrepareCrashTarget(const std::string& log_dir, uint64_t seconds, internal::CrashTarget* c) {
  exporter::OutputDir dir;
  if (Status s = exporter::OutputDir::OpenBelow(log_dir, {"plugins", "profile"}, &dir); !s.ok()) return s;
  *c = internal::CrashTarget{};
  c->pid = getpid();
  std::snprintf(c->tmp_name, sizeof c->tmp_name, ".spyglass_crash_%lld.tmp", static_cast<long long>(c->pid));
  std::snprintf(c->run_name, sizeof c->run_name, "%s_crash_%lld", exporter::TimestampRunName().c_str(),
                static_cast<long long>(c->pid));
  std::string host = exporter::SanitizeHostForFile(Hostname());
  std::snprintf(c->hostname, sizeof c->hostname, "%s", Hostname().c_str());
  std::snprintf(c->file_name, sizeof c->file_name, "%s.xplane.pb", host.c_str());
  c->dir_fd = fcntl(dir.fd(), F_DUPFD_CLOEXEC, 0);
  if (c->dir_fd < 0) return InternalError("cannot keep " + dir.path() + " open: " + std::strerror(errno));
  c->tmp_fd = openat(c->dir_fd, c->tmp_name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (c->tmp_fd < 0) {
    Status s = InternalError("cannot create " + dir.PathOf(c->tmp_name) + ": " + std::strerror(errno));
    close(c->dir_fd);
    c->dir_fd = -1;
    return s;
  }
  c->word = internal::g_state.session_word.load(std::memory_order_relaxed);
  c->ring_seconds = seconds;
  internal::TickConverter clock = internal::TickConverter::Calibrate();
  c->ns_per_tick = clock.ns_per_tick();
  c->start_ticks = internal::now_ticks();
  c->start_mono_ns = internal::monotonic_ns();
  c->start_wall_ns = internal::wall_ns();
  return Status::Ok();
}

void CloseCrashTarget(internal::CrashTarget* c) {
  if (c->tmp_fd >= 0) {
    close(c->tmp_fd);
    unlinkat(c->dir_fd, c->tmp_name, 0);
  }
  if (c->dir_fd >= 0) close(c->dir_fd);
  *c = internal::CrashTarget{};
}

// At exit with the recorder still running: the crash file is not left behind.
void RemoveCrashFileAtExit() {
  Triggers& t = triggers();
  if (t.crash.tmp_fd >= 0) unlinkat(t.crash.dir_fd, t.crash.tmp_name, 0);
}

}  // namespace

Status StartFlightRecorderTriggers(const std::string& log_dir, const FlightRecorderConfig& config) {
  Triggers& t = triggers();
  std::lock_guard<std::mutex> lock(t.mu);
  if (config.dump_on_crash) {
    if (Status s = PrepareCrashTarget(log_dir, config.seconds, &t.crash); !s.ok()) return s;
    static const int at_exit = std::atexit(RemoveCrashFileAtExit);
    (void)at_exit;
    struct sigaction sa {};
    sa.sa_sigaction = OnFatalSignal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    g_crash_entered.store(false);
    for (size_t i = 0; i < std::size(kFatalSignals); ++i) sigaction(kFatalSignals[i], &sa, &t.old_fatal[i]);
    t.crash_installed = true;
  }
  if (config.dump_signal != 0 || config.slow_step_ms > 0) {
    if (pipe2(t.wake, O_CLOEXEC | O_NONBLOCK) != 0) return InternalError(std::string("pipe: ") + std::strerror(errno));
    t.thread = std::thread(DumpThread, t.wake[0], config.seconds);
    internal::g_dump_wake_fd.store(t.wake[1]);
  }
  if (config.dump_signal != 0) {
    struct sigaction sa {};
    sa.sa_handler = OnDumpSignal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(config.dump_signal, &sa, &t.old_dump_action);
    t.dump_signal = config.dump_signal;
  }
  if (config.slow_step_ms > 0) {
    internal::TickConverter clock = internal::TickConverter::Calibrate();
    internal::g_state.slow_step_ticks.store(
        static_cast<uint64_t>(static_cast<double>(config.slow_step_ms) * 1e6 / clock.ns_per_tick()));
  }
  return Status::Ok();
}

void FlightRecorderAfterForkChild() {
  // The parent's triggers are not the child's: its dump thread is not here,
  // and its crash file and pipe are the parent's.
  Triggers& t = triggers();
  new (&t.mu) std::mutex;
  internal::g_dump_wake_fd.store(-1);
  internal::g_state.slow_step_ticks.store(0);
  if (t.dump_signal != 0) RestoreDumpSignal();
  if (t.crash_installed) RestoreFatalHandlers(/*only_ours=*/true);
  for (int fd : {t.wake[0], t.wake[1], t.crash.tmp_fd, t.crash.dir_fd})
    if (fd >= 0) close(fd);
  new (&t.thread) std::thread;  // the parent's thread does not exist here (its object is abandoned)
  t.wake[0] = t.wake[1] = -1;
  t.dump_signal = 0;
  t.crash_installed = false;
  t.crash = internal::CrashTarget{};
}

void StopFlightRecorderTriggers() {
  Triggers& t = triggers();
  std::lock_guard<std::mutex> lock(t.mu);
  internal::g_state.slow_step_ticks.store(0);
  if (t.dump_signal != 0) {
    RestoreDumpSignal();
    t.dump_signal = 0;
  }
  if (t.wake[1] >= 0) {
    internal::g_dump_wake_fd.store(-1);
    close(t.wake[1]);  // the thread reads EOF and returns
    t.wake[1] = -1;
  }
  if (t.thread.joinable()) t.thread.join();
  if (t.wake[0] >= 0) {
    close(t.wake[0]);
    t.wake[0] = -1;
  }
  if (t.crash_installed) {
    RestoreFatalHandlers(/*only_ours=*/true);
    t.crash_installed = false;
    CloseCrashTarget(&t.crash);
  }
}

}  // namespace spyglass::session
