// `spyglass run`: runs a program with the heap hook (libspyglass_heap.so)
// preloaded and reports the memory profiles it wrote. --trace, --server and
// --flight-recorder are the SPYGLASS_* settings (session/env_start.h), checked
// here by the same parser and handed to the program's environment: libspyglass
// (linked, or loaded by the hook) starts them at load. The program keeps its
// arguments (SplitRunProgram), gets the signals sent to this process once
// (Forward; Job keeps group signals from reaching it twice) and its death is
// this process's (DieLike).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "export/output_file.h"
#include "memory/run_summary.h"
#include "memory/tracker.h"
#include "sampling/sampler_options.h"
#include "session/env_start.h"

namespace spyglass::cli {
namespace {

namespace fs = std::filesystem;

// The signals `spyglass run` passes on to the program: the ones a user or a
// supervisor sends to the wrapper's pid meaning the program (the flight
// recorder's and the heap snapshot's triggers, which spyglass_dump_signal may
// set to SIGUSR1, SIGUSR2, SIGHUP or a real-time one; the stop requests).
std::vector<int> ForwardedSignals() {
  std::vector<int> sigs = {SIGUSR1, SIGUSR2, SIGTERM, SIGHUP, SIGINT, SIGQUIT};
  for (int s = SIGRTMIN; s <= SIGRTMAX; ++s) sigs.push_back(s);
  return sigs;
}

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_tty = -1;    // Job::tty
volatile sig_atomic_t g_group = 0;   // Job::group
volatile sig_atomic_t g_continued = 0;
// Passes a signal on to the program. Only signals sent to this process reach
// here: the program never shares a process group with it (Job), so a kill of
// a whole group, a terminal's Ctrl-C and `timeout`'s group kill reach the
// program directly or through here, never both. The checks that remain: the
// terminal's signals (SI_KERNEL) went to its foreground group, which is the
// program's unless this job just came to the foreground and has not handed
// the terminal on yet; a signal the program sent us goes back to nobody.
void Forward(int sig, siginfo_t* info, void*) {
  pid_t child = g_child;
  if (child <= 0) return;
  int saved = errno;
  bool ours = info == nullptr || info->si_code != SI_KERNEL || (g_tty >= 0 && tcgetpgrp(g_tty) == g_group);
  if (ours && !(info && info->si_code <= 0 && info->si_pid == child)) kill(child, sig);
  errno = saved;
}
void Continued(int) { g_continued = 1; }

// The set of `sig` alone.
sigset_t Only(int sig) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  return set;
}

// Gives `sig` the disposition `handler` (SIG_DFL, or a plain handler);
// returns the one it had.
struct sigaction Dispose(int sig, void (*handler)(int)) {
  struct sigaction sa {}, was {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, &was);
  return was;
}

// Where the program runs among the process groups, as a shell places a job,
// so that no signal sent to a group reaches it twice.
// - This process leads its group (a shell's job, setsid, a new session): the
//   group is the job's, so the program gets a group of its own and, when the
//   job is in the foreground of a terminal, the terminal (Ctrl-C and Ctrl-Z
//   go to the program alone). A stop of the program stops this job too, and
//   its continuation continues the program, in the foreground if the job is.
//   A SIGKILL to the job's group cannot be passed on: the program gets it as
//   its parent-death signal.
// - Otherwise this process is one of another's group (`timeout`, make, a
//   script, a parent's Popen): it steps out into a group of its own and
//   leaves the program in that group, terminal and all, so that the group's
//   signals (SIGKILL and SIGSTOP too) reach the program as they would without
//   spyglass, and only those sent to this pid are passed on. It rejoins the
//   group when the program is gone.
struct Job {
  pid_t self = 0;
  pid_t group = 0;          // the group this process was started in
  bool own_group = false;   // the program leads a new group (this process leads `group`)
  int tty = -1;             // own_group: the controlling terminal, for job control
  bool foreground = false;  // own_group: `group` was the terminal's foreground group
  bool stepped_out = false; // !own_group: this process left `group` for one of its own

  void Decide() {
    self = getpid();
    group = getpgrp();
    own_group = group == self;
    if (own_group) {
      tty = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);  // fails without one
      foreground = tty >= 0 && tcgetpgrp(tty) == group;
      g_tty = tty;
      g_group = group;
    } else {
      stepped_out = setpgid(0, 0) == 0;
    }
  }
  // Both sides place the child (a shell's way: whichever runs first), before
  // it can read the terminal or be signalled as the group's.
  void Place(pid_t child) const {
    if (own_group) {
      setpgid(child, child);
      if (foreground) tcsetpgrp(tty, child);  // SIGTTOU blocked: allowed from the background
    } else if (stepped_out) {
      setpgid(child, group);
    }
  }
  // In the child, before exec.
  void PlaceChild() const {
    Place(getpid());
    if (own_group) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != self) raise(SIGKILL);  // the parent died before the prctl
    }
  }
  // Waits for the program's end; with a terminal, follows its stops and the
  // job's continuations (SIGCONT), and hands the terminal on when the job
  // comes to the foreground (`fg` of a running job sends no signal: looked
  // at every 100 ms; until then Forward passes Ctrl-C on).
  int Wait(pid_t child) const {
    int status = 0;
    if (tty < 0) {
      while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
      }
      return status;
    }
    struct sigaction was = Dispose(SIGCONT, Continued);
    sigset_t chld = Only(SIGCHLD), old;
    sigprocmask(SIG_BLOCK, &chld, &old);
    for (;;) {
      pid_t got = waitpid(child, &status, WNOHANG | WUNTRACED);
      if (got < 0 && errno == EINTR) continue;
      if (got == child && WIFSTOPPED(status)) {
        int sig = WSTOPSIG(status);
        // A read or write of the terminal while it was still ours: hand it on.
        // Otherwise (Ctrl-Z, SIGSTOP) the job stops as a whole.
        if (tcgetpgrp(tty) != group || (sig != SIGTTIN && sig != SIGTTOU)) {
          if (tcgetpgrp(tty) == child) tcsetpgrp(tty, group);
          StopLike(sig);
        }
        Resume(child);
        continue;
      }
      if (got != 0) break;
      if (g_continued)
        Resume(child);
      else if (tcgetpgrp(tty) == group)
        tcsetpgrp(tty, child);
      struct timespec tick {0, 100 * 1000 * 1000};
      sigtimedwait(&chld, nullptr, &tick);
    }
    sigprocmask(SIG_SETMASK, &old, nullptr);
    sigaction(SIGCONT, &was, nullptr);
    return status;
  }
  // The job was continued (fg, bg, or a stop that an orphaned group does not
  // take): the program goes on, with the terminal if the job has it.
  void Resume(pid_t child) const {
    g_continued = 0;
    if (tcgetpgrp(tty) == group) tcsetpgrp(tty, child);
    kill(-child, SIGCONT);
  }
  // The program is gone: the terminal and the group go back as they were.
  void Restore(pid_t child) {
    if (tty >= 0) {
      if (tcgetpgrp(tty) == child) tcsetpgrp(tty, group);
      g_tty = -1;
      close(tty);
      tty = -1;
    }
    if (stepped_out) setpgid(0, group);
  }
  // Stops this process by `sig`'s default action (the shell reports the
  // job's stop as the program's); returns once continued.
  static void StopLike(int sig) {
    struct sigaction was = Dispose(sig, SIG_DFL);
    sigset_t one = Only(sig), old;
    sigprocmask(SIG_UNBLOCK, &one, &old);
    raise(sig);  // discarded in an orphaned group: nothing to return to then
    sigprocmask(SIG_SETMASK, &old, nullptr);
    sigaction(sig, &was, nullptr);
  }
};

// Ends this process the way the program ended, so that its parent sees the
// same death (a Python parent reads -6, a shell 134): the signal's default
// action, without a core file of the wrapper (the program dumped its own).
// Returns the shell's 128+N if that somehow did not end us.
int DieLike(int sig) {
  std::cout.flush();
  std::cerr.flush();
  struct rlimit no_core {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  signal(sig, SIG_DFL);
  sigset_t set = Only(sig);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  raise(sig);
  return 128 + sig;
}

// libspyglass_heap.so: $SPYGLASS_HEAP_LIB, else next to this binary (build
// tree) or in ../lib* (installed).
std::string FindHeapLib() {
  if (const char* e = std::getenv("SPYGLASS_HEAP_LIB"); e && *e) return e;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  fs::path dir = self.parent_path();
  for (fs::path cand : {dir / "libspyglass_heap.so", dir / ".." / "lib" / "libspyglass_heap.so",
                        dir / ".." / "lib64" / "libspyglass_heap.so"}) {
    if (fs::exists(cand, ec)) return fs::weakly_canonical(cand, ec).string();
  }
  for (const auto& entry : fs::directory_iterator(dir / "..", ec)) {
    fs::path cand = entry.path() / "libspyglass_heap.so";  // lib/x86_64-linux-gnu
    if (entry.path().filename().string().rfind("lib", 0) == 0 && fs::exists(cand, ec)) return cand.string();
    for (const auto& sub : fs::directory_iterator(entry.path(), ec))
      if (sub.is_directory(ec) && fs::exists(sub.path() / "libspyglass_heap.so", ec))
        return (sub.path() / "libspyglass_heap.so").string();
  }
  return "";
}

// A Python program under the hook: the startup module beside the hook goes
// on PYTHONPATH (it turns on Python frames, src/memory/heap_python.cc; other
// programs never read it), and `allocator` "malloc" bypasses pymalloc.
void SetPythonEnv(const std::string& hook, const std::string& allocator) {
  fs::path startup = fs::path(hook).parent_path() / "spyglass_python_startup";
  std::error_code ec;
  if (fs::exists(startup / "sitecustomize.py", ec)) {
    std::string path = startup.string();
    if (const char* old = std::getenv("PYTHONPATH"); old && *old) path += std::string(":") + old;
    setenv("PYTHONPATH", path.c_str(), 1);
  }
  if (allocator == "malloc") setenv("PYTHONMALLOC", "malloc", 1);
}

// The SPYGLASS_* settings given as flags (name -> value).
using Settings = std::vector<std::pair<const char*, std::string>>;
// Each setting's flag, to name it in errors.
const std::pair<const char*, std::string> kSettingFlags[] = {{session::kEnvTraceDir, "--trace"},
                                                             {session::kEnvServerPort, "--server"},
                                                             {session::kEnvFlightRecorder, "--flight-recorder"},
                                                             {session::kEnvOptions, "--options"}};

// The program and its arguments: everything from the first word that is not
// one of run's options (or its value), or after "--" (SplitRunProgram).
std::vector<std::string> g_program;
CLI::App* g_run = nullptr;  // the subcommand

// The runs under <log_dir>/plugins/profile/, sorted (none when log_dir is "").
std::vector<std::string> TraceRuns(const std::string& log_dir) {
  std::vector<std::string> runs;
  if (log_dir.empty()) return runs;
  std::error_code ec;
  for (fs::directory_iterator it(fs::path(log_dir) / "plugins" / "profile", ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->is_directory(ec)) runs.push_back(it->path().filename().string());
    if (runs.size() >= 100000) break;  // a bound on a directory we did not make
  }
  std::sort(runs.begin(), runs.end());
  return runs;
}

int Run(bool memory, const Settings& settings, const std::string& out_dir, uint64_t sample_bytes,
        const std::string& python_allocator, bool follow_children, bool timeline,
        const std::vector<std::string>& command) {
  if (command.empty()) {
    std::cerr << "spyglass run: no program given (spyglass run [--memory] [--trace DIR] [--server PORT] "
                 "[--flight-recorder S] [--] PROGRAM [ARGS...])\n";
    return 2;
  }
  session::StartSettings parsed;
  auto get = [&](const char* name) -> const char* {
    for (const auto& [n, v] : settings)
      if (std::strcmp(n, name) == 0) return v.c_str();
    return nullptr;
  };
  if (Status s = session::ParseStartSettings(get, &parsed); !s.ok()) {
    // The parser speaks of the environment; here the user gave a flag.
    std::string message = s.message();
    for (const auto& [env, flag] : kSettingFlags)
      if (message.rfind(env, 0) == 0) message = flag + message.substr(std::strlen(env));
    std::cerr << "spyglass run: " << message << "\n";
    return 2;
  }
  const std::string& trace_dir = parsed.trace_dir;
  if (!memory && parsed.empty()) memory = true;
  std::string lib = FindHeapLib();
  if (lib.empty()) {
    std::cerr << "spyglass run: cannot find libspyglass_heap.so (set SPYGLASS_HEAP_LIB)\n";
    return 2;
  }
  std::error_code ec;
  std::string dir = fs::absolute(out_dir, ec).string();
  if (memory) {
    fs::create_directories(dir, ec);
    if (ec) {
      std::cerr << "spyglass run: cannot create " << dir << ": " << ec.message() << "\n";
      return 2;
    }
  }
  // What the directory held before: those files are not this run's.
  memory::DirListing before;
  if (memory) before = memory::ListDir(dir);
  const std::vector<std::string> runs_before = TraceRuns(trace_dir);
  std::string preload = lib;
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;
  // The forwarded signals wait, blocked, until the handler knows the child;
  // the exec's errno comes back through a pipe that a successful exec closes.
  // SIGTTOU stays blocked here (the program gets the mask back): handing the
  // terminal over and back (tcsetpgrp) from the background is then allowed.
  sigset_t forwarded, old_mask;
  sigemptyset(&forwarded);
  for (int sig : ForwardedSignals()) sigaddset(&forwarded, sig);
  sigaddset(&forwarded, SIGTTOU);
  int exec_pipe[2];
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) {
    std::perror("spyglass run: pipe");
    return 2;
  }
  sigprocmask(SIG_BLOCK, &forwarded, &old_mask);
  Job job;
  job.Decide();
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("spyglass run: fork");
    job.Restore(-1);
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    close(exec_pipe[0]), close(exec_pipe[1]);
    return 2;
  }
  // A Python interpreter without --memory: the spyglass package starts the
  // settings at interpreter start (its spyglass-autostart.pth), with the
  // Python tracer; libspyglass loaded by the hook would write a second run.
  std::string prog = fs::path(command[0]).filename().string();
  bool python = prog.rfind("python", 0) == 0 && prog.find_first_not_of("python0123456789.") == std::string::npos;
  if (pid == 0) {
    job.PlaceChild();
    if (memory || !python) setenv("LD_PRELOAD", preload.c_str(), 1);
    setenv("SPYGLASS_HEAP", memory ? "1" : "0", 1);
    if (memory) setenv("SPYGLASS_HEAP_PROFILE_DIR", dir.c_str(), 1);
    // This process, through its execs, is the program (a launcher that execs
    // its program profiles that program); what it starts is a child.
    setenv("SPYGLASS_HEAP_PID", std::to_string(getpid()).c_str(), 1);
    if (follow_children)
      setenv("SPYGLASS_HEAP_FOLLOW_CHILDREN", "1", 1);
    else
      unsetenv("SPYGLASS_HEAP_FOLLOW_CHILDREN");
    if (memory) SetPythonEnv(lib, python_allocator);
    if (sample_bytes) setenv("SPYGLASS_HEAP_SAMPLE_BYTES", std::to_string(sample_bytes).c_str(), 1);
    for (const auto& [name, value] : settings) {
      if (std::strcmp(name, session::kEnvTraceDir) == 0)
        setenv(name, trace_dir.c_str(), 1);  // absolute: the program may change directory
      else
        setenv(name, value.c_str(), 1);
    }
    std::vector<char*> argv;
    for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    close(exec_pipe[0]);
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    execvp(argv[0], argv.data());
    int err = errno;
    (void)!write(exec_pipe[1], &err, sizeof err);
    _exit(127);
  }
  close(exec_pipe[1]);
  job.Place(pid);
  g_child = pid;
  struct sigaction sa {};
  sa.sa_sigaction = Forward;
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  std::vector<int> installed;
  for (int sig : ForwardedSignals()) {
    // One this process was started ignoring (nohup, a background job's
    // SIGINT) the program ignores too: nothing to pass on.
    struct sigaction was {};
    if (sigaction(sig, nullptr, &was) == 0 && was.sa_handler == SIG_IGN) continue;
    if (sigaction(sig, &sa, nullptr) == 0) installed.push_back(sig);
  }
  sigset_t unblock = forwarded;
  sigdelset(&unblock, SIGTTOU);
  sigprocmask(SIG_UNBLOCK, &unblock, nullptr);
  int exec_errno = 0;
  ssize_t got;
  while ((got = read(exec_pipe[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
  }
  close(exec_pipe[0]);
  int status = job.Wait(pid);
  // The program is gone: a signal now is for this process (a Ctrl-C during a
  // long summary ends it), as before the program ran.
  g_child = 0;
  for (int sig : installed) signal(sig, SIG_DFL);
  job.Restore(pid);
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  if (got == sizeof exec_errno) {
    // Nothing ran: no profile to look for. A shell's statuses: 127 not found, 126 not runnable.
    std::cerr << "spyglass run: cannot run " << command[0] << ": " << std::strerror(exec_errno) << "\n";
    return exec_errno == ENOENT ? 127 : 126;
  }
  if (memory) {
    memory::ProgramEnd end{WIFSIGNALED(status), WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status)};
    std::cerr << memory::SummarizeRun(dir, pid, end, before, timeline);
  }
  // Said here too: the program's own line is lost when it closes stderr (sort does).
  if (!trace_dir.empty()) {
    const std::vector<std::string> runs = TraceRuns(trace_dir);
    std::vector<std::string> written;
    std::set_difference(runs.begin(), runs.end(), runs_before.begin(), runs_before.end(), std::back_inserter(written));
    if (written.empty())
      std::cerr << "spyglass run: no trace was written under " << trace_dir << "/plugins/profile/\n";
    for (const std::string& run : written) {
      std::cerr << "spyglass run: trace in " << trace_dir << "/plugins/profile/" << run << "/\n";
      std::error_code dir_ec;
      for (fs::directory_iterator it(fs::path(trace_dir) / "plugins" / "profile" / run, dir_ec), end;
           !dir_ec && it != end; it.increment(dir_ec)) {
        const std::string name = it->path().filename().string();
        if (name.rfind("cpu.", 0) == 0 && name.size() > 9 && name.compare(name.size() - 5, 5, ".prof") == 0)
          std::cerr << "spyglass run: CPU profile " << it->path().string() << " (go tool pprof -top "
                    << it->path().string() << ")\n";
      }
    }
    if (!written.empty())
      std::cerr << "Read it with: spyglass summary " << trace_dir << "   or   spyglass report " << trace_dir
                << (memory && dir == trace_dir ? "   (the memory profiles are beside it)" : "") << "\n";
  }
  if (WIFSIGNALED(status)) return DieLike(WTERMSIG(status));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace

void AddRunCommand(CLI::App& app) {
  auto* run = app.add_subcommand("run", "Run a program with profiling started from outside: a trace (--trace), the "
                                        "profiler server (--server), the flight recorder (--flight-recorder), heap "
                                        "snapshots on exit and on SIGUSR2 (--memory, the default without those; "
                                        "Python programs, also through a launcher script, get Python frames "
                                        "interleaved with native ones); Python programs: python -m spyglass run too");
  g_run = run;
  static bool memory = false;
  static std::string trace_dir, server, flight_recorder, options, out_dir = ".";
  static std::string sample_bytes = "0";
  run->add_flag("--memory", memory, "track the heap (the default without --trace, --server and --flight-recorder)");
  run->add_option("--trace", trace_dir,
                  "record a trace from start to exit into this log dir (with --memory: a live-bytes counter track); "
                  "the program's SPYGLASS_TRACE_DIR");
  run->add_option("--server", server,
                  "start the profiler server at load, on [ADDRESS:]PORT (127.0.0.1 unless ADDRESS; 0: a free port, "
                  "printed): `spyglass collect PORT MS` captures it; SPYGLASS_SERVER_PORT");
  run->add_option("--flight-recorder", flight_recorder,
                  "keep the last SECONDS of events in the flight recorder's ring; SPYGLASS_FLIGHT_RECORDER");
  run->add_option("--options", options,
                  "key=value,... ProfileOptions fields and advanced keys for the trace; SPYGLASS_OPTIONS");
  run->add_option("-o,--out", out_dir,
                  "where the profiles go (default: the --trace dir, else .): memory.<pid>.<program>.exit.prof and .peak.prof at exit (with the series "
                  ".timeline.tsv), .<n>.prof on SIGUSR2, "
                  ".oom.prof when an allocation fails, .signal.prof on a fatal signal, .cgroup.prof near a "
                  "cgroup memory limit")
      ->default_val(".");
  static bool timeline = false;
  run->add_flag("--timeline", timeline,
                "at the end, chart the program's live bytes over time (per device and top call sites; the series "
                "is always recorded, at bounded cost, in memory.<pid>.<program>.timeline.tsv: see memtop --over-time)");
  static bool follow_children = false;
  run->add_flag("--follow-children", follow_children,
                "profile the processes the program starts too (by default only the program, through its "
                "execs: a launcher script that execs its program profiles that program)");
  run->add_option("--sample-bytes", sample_bytes,
                  "sample one allocation per N bytes on average (0 = every allocation, the default; at most " +
                      std::to_string(memory::internal::kMaxSampleBytes) + ")")
      ->default_val("0");
  static std::string sample_hz, sample_mode = "cpu";
  run->add_option("--sample", sample_hz,
                  "sample every thread's CPU time at HZ per second (default " +
                      std::to_string(sampling::kDefaultSampleHz) +
                      "): the samples go on the trace's threads and into cpu.<pid>.<program>.prof (pprof) beside it; "
                      "a trace is recorded into -o's folder unless --trace says where; SPYGLASS_OPTIONS="
                      "spyglass_cpu_sample_hz=HZ")
      ->expected(0, 1);
  run->add_option("--sample-mode", sample_mode,
                  "cpu (default): each thread's CPU time; wall: also the time it is blocked in the kernel (sleep, "
                  "I/O, locks, the GIL), as '[off CPU: <call>]' frames, read from /proc without a signal "
                  "(spyglass_cpu_sample_mode); needs --sample")
      ->check(CLI::IsMember({"cpu", "wall"}));
  static std::string python_allocator = "pymalloc";
  run->add_option("--python-allocator", python_allocator,
                  "Python programs: 'pymalloc' (default) records Python's objects as Python allocates them; "
                  "'malloc' sets PYTHONMALLOC=malloc, so that every object is a malloc block (slower, more memory, "
                  "but the profile is the process's heap as malloc sees it)")
      ->check(CLI::IsMember({"pymalloc", "malloc"}))
      ->default_val("pymalloc");
  static std::string python_mode = "full";
  run->add_option("--python-mode", python_mode,
                  "Python programs: 'full' (default) records every object of Python's allocators and every malloc, "
                  "Python frames interleaved with native ones (memray --native --trace-python-allocators); 'light' "
                  "records malloc's blocks and pymalloc's arenas with the Python frames only (memray's default "
                  "mode), close to the program's own speed (SPYGLASS_PYTHON_MODE)")
      ->check(CLI::IsMember({"full", "light"}))
      ->default_val("full");
  run->footer("usage: spyglass run [OPTIONS] [--] PROGRAM [ARGS...]\n"
              "Everything from PROGRAM on is the program's, its options too: `spyglass run sort -r f` runs `sort -r f`.\n"
              "Stacks are unwound with DWARF CFI (.eh_frame): complete without frame pointers, as distributions build. "
              "SPYGLASS_UNWINDER=fp walks frame pointers instead (faster, only for programs built with them); "
              "=libunwind and =glibc use those unwinders.");
  run->callback([] {
    uint64_t bytes = 0;
    if (!memory::internal::ParseSampleBytes(sample_bytes.c_str(), &bytes)) {
      std::cerr << "spyglass run: --sample-bytes must be an integer from 0 to " << memory::internal::kMaxSampleBytes
                << " (got '" << sample_bytes.substr(0, 32) << (sample_bytes.size() > 32 ? "...'" : "'") << ")\n";
      std::exit(2);
    }
    Settings settings;
    std::string all_options = options;
    if (g_run->count("--sample") > 0) {
      uint64_t hz = sampling::kDefaultSampleHz;
      if (!sample_hz.empty()) {
        char* end = nullptr;
        errno = 0;
        unsigned long long v = std::strtoull(sample_hz.c_str(), &end, 10);
        if (sample_hz[0] < '0' || sample_hz[0] > '9' || *end != '\0' || errno != 0 || v == 0 ||
            v > sampling::MaxSampleRate()) {
          std::cerr << "spyglass run: --sample takes a rate from 1 to " << sampling::MaxSampleRate()
                    << " per second (the kernel's perf_event_max_sample_rate), got '" << sample_hz.substr(0, 32)
                    << "'\n";
          std::exit(2);
        }
        hz = v;
      }
      all_options += std::string(all_options.empty() ? "" : ",") + "spyglass_cpu_sample_hz=" + std::to_string(hz);
      if (g_run->count("--sample-mode") > 0) all_options += ",spyglass_cpu_sample_mode=" + sample_mode;
      // Samples live in a trace: one is recorded into -o's folder when --trace does not say where.
      if (trace_dir.empty() && server.empty() && flight_recorder.empty()) trace_dir = out_dir;
    } else if (g_run->count("--sample-mode") > 0) {
      std::cerr << "spyglass run: --sample-mode needs --sample\n";
      std::exit(2);
    }
    if (!trace_dir.empty()) settings.emplace_back(session::kEnvTraceDir, trace_dir);
    if (!server.empty()) settings.emplace_back(session::kEnvServerPort, server);
    if (!flight_recorder.empty()) settings.emplace_back(session::kEnvFlightRecorder, flight_recorder);
    if (!all_options.empty()) settings.emplace_back(session::kEnvOptions, all_options);
    // One folder for everything a run writes: with --trace and no -o, the
    // memory profiles go beside the trace (spyglass report DIR finds both).
    const std::string out = !trace_dir.empty() && g_run->count("--out") == 0 ? trace_dir : out_dir;
    // Read by the Python startup module (src/memory/python_startup/sitecustomize.py).
    if (python_mode == "light")
      setenv("SPYGLASS_PYTHON_MODE", "light", 1);
    else
      unsetenv("SPYGLASS_PYTHON_MODE");
    std::exit(Run(memory, settings, out, bytes, python_allocator, follow_children, timeline, g_program));
  });
}

std::vector<char*> SplitRunProgram(CLI::App& app, int argc, char** argv) {
  std::vector<char*> mine(argv, argv + argc);
  // The subcommand: the first word (the top level's flags take no value).
  int at = 1;
  while (at < argc && argv[at][0] == '-') ++at;
  CLI::App* run = at < argc && std::strcmp(argv[at], "run") == 0 ? g_run : nullptr;
  if (!run || run->get_parent() != &app) return mine;
  for (int i = at + 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      g_program.assign(argv + i + 1, argv + argc);
      mine.resize(i);
      return mine;
    }
    if (a.size() < 2 || a[0] != '-') {
      g_program.assign(argv + i, argv + argc);
      mine.resize(i);
      return mine;
    }
    // One of run's options (an unknown one is CLI11's to refuse): its value
    // is the next word unless given as --name=value or -oVALUE.
    bool long_name = a[1] == '-';
    std::string name = long_name ? a.substr(0, a.find('=')) : a.substr(0, 2);
    bool attached = long_name ? name.size() < a.size() : a.size() > 2;
    const CLI::Option* opt = run->get_option_no_throw(name);
    if (opt && opt->get_expected_min() > 0 && !attached) ++i;
    // --sample's rate is optional: the next word is it when it is a number.
    if (name == "--sample" && !attached && i + 1 < argc && argv[i + 1][0] >= '0' && argv[i + 1][0] <= '9') ++i;
  }
  return mine;
}

}  // namespace spyglass::cli
