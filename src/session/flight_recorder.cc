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
#include "common/kept_fd.h"
#include "common/signal_safe.h"
#include "export/log_dir.h"
#include "export/output_file.h"
#include "session/session.h"
#include "spyglass/profiler.h"
#include "trace/crash_dump.h"
#include "trace/recorder.h"

namespace spyglass::internal {

// The pipe the dump thread reads; -1 when no flight recorder runs. Its
// identity (g_dump_wake) is set before the number is published.
std::atomic<int> g_dump_wake_fd{-1};
kept_fd::KeptFd g_dump_wake;
// Dump requests not sent because the program had taken the pipe's number.
std::atomic<uint64_t> g_dump_wake_refused{0};

// Async-signal-safe: a signal handler calls it.
void WakeDumpThread(char why) {
  int fd = g_dump_wake_fd.load(std::memory_order_acquire);
  if (fd < 0) return;
  if (g_dump_wake.fd != fd || !kept_fd::IsOurs(g_dump_wake)) {  // the program's file now: not written
    g_dump_wake_refused.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  (void)!write(fd, &why, 1);  // non-blocking: a full pipe has a dump pending already
}

void step_was_slow() { WakeDumpThread('t'); }

}  // namespace spyglass::internal

namespace spyglass::session {
namespace {

constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

struct Triggers {
  std::mutex mu;  // start/stop
  std::thread thread;
  std::atomic<bool> stopping{false};  // the dump thread returns
  kept_fd::KeptFd wake_read, wake_write;
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
  internal::WakeDumpThread('s');
  errno = saved;
}

// One line on stderr from a signal handler.
void SaySignalSafe(const char* a, const char* b) {
  (void)!write(2, a, std::strlen(a));
  (void)!write(2, b, std::strlen(b));
  (void)!write(2, "\n", 1);
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
    const char* why = nullptr;
    if (!internal::WriteCrashRun(t.crash, sig, &why))
      SaySignalSafe("spyglass: the flight recorder's crash dump is not written: ", why);
  }
  signal_safe::ReraiseUnlessFault(sig, info);
}

void DumpThread(kept_fd::KeptFd wake, uint64_t seconds) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point last_slow_dump{};
  bool slow_dumped = false;
  const int fd = wake.fd;
  while (!triggers().stopping.load()) {
    // Bounded: should the program take the pipe's number, stop is not missed.
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, 500);
    if (r < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (r == 0) continue;
    if (!kept_fd::IsOurs(wake)) {  // the program's now: never read from it
      std::fprintf(stderr,
                   "spyglass: the flight recorder's dump thread stops: the program closed or reused its "
                   "descriptor %d (dumps by signal and slow step are off)\n",
                   fd);
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
// allocating is allowed: unnamed where the file system allows (nothing is
// left behind by _exit, SIGKILL or a program closing it), else named tmp_name.
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
  c->dir = kept_fd::Keep(fcntl(dir.fd(), F_DUPFD_CLOEXEC, 0));
  if (c->dir.fd < 0) return InternalError("cannot keep " + dir.path() + " open: " + std::strerror(errno));
  int file = openat(c->dir.fd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
  c->file_named = file < 0;
  if (file < 0) file = openat(c->dir.fd, c->tmp_name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  c->file = kept_fd::Keep(file);
  if (c->file.fd < 0) {
    Status s = InternalError("cannot create " + dir.PathOf(c->tmp_name) + ": " + std::strerror(errno));
    if (c->file_named) unlinkat(c->dir.fd, c->tmp_name, 0);
    kept_fd::CloseIfOurs(&c->dir);
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

// Removes the named crash file (through the directory, while it is ours).
void RemoveNamedCrashFile(const internal::CrashTarget& c) {
  if (c.file_named && kept_fd::IsOurs(c.dir)) unlinkat(c.dir.fd, c.tmp_name, 0);
}

// Descriptors the program took over are left to it.
void CloseCrashTarget(internal::CrashTarget* c) {
  RemoveNamedCrashFile(*c);
  kept_fd::CloseIfOurs(&c->file);
  kept_fd::CloseIfOurs(&c->dir);
  *c = internal::CrashTarget{};
}

// At exit with the recorder still running: the crash file is not left behind.
void RemoveCrashFileAtExit() { RemoveNamedCrashFile(triggers().crash); }

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
    int wake[2];
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) return InternalError(std::string("pipe: ") + std::strerror(errno));
    t.wake_read = kept_fd::Keep(wake[0]);
    t.wake_write = kept_fd::Keep(wake[1]);
    if (t.wake_read.fd < 0 || t.wake_write.fd < 0) {
      kept_fd::CloseIfOurs(&t.wake_read);
      kept_fd::CloseIfOurs(&t.wake_write);
      return InternalError(std::string("cannot keep the dump pipe open: ") + std::strerror(errno));
    }
    t.stopping.store(false);
    internal::g_dump_wake_refused.store(0);
    t.thread = std::thread(DumpThread, t.wake_read, config.seconds);
    internal::g_dump_wake = t.wake_write;
    internal::g_dump_wake_fd.store(t.wake_write.fd, std::memory_order_release);
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
  for (kept_fd::KeptFd* k : {&t.wake_read, &t.wake_write, &t.crash.file, &t.crash.dir}) kept_fd::CloseIfOurs(k);
  new (&t.thread) std::thread;  // the parent's thread does not exist here (its object is abandoned)
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
  if (t.thread.joinable()) {
    internal::g_dump_wake_fd.store(-1);
    t.stopping.store(true);
    kept_fd::CloseIfOurs(&t.wake_write);  // the thread reads EOF and returns (or sees `stopping`)
    t.thread.join();
    kept_fd::CloseIfOurs(&t.wake_read);
    if (uint64_t n = internal::g_dump_wake_refused.exchange(0); n > 0)
      std::fprintf(stderr,
                   "spyglass: %llu flight recorder dump request(s) dropped: the program closed or reused the "
                   "descriptor of the recorder's wake-up pipe\n",
                   static_cast<unsigned long long>(n));
  }
  if (t.crash_installed) {
    RestoreFatalHandlers(/*only_ours=*/true);
    t.crash_installed = false;
    CloseCrashTarget(&t.crash);
  }
}

}  // namespace spyglass::session
