// The flight recorder inside programs that do what programs do: exit after a
// dump, install their own crash handler, run from a shared temporary
// directory, close every descriptor and reuse the numbers (daemons). The
// program's exit status, output, handlers and files stay its own.
// The programs are flight_recorder_hostile_child (libspyglass, started from
// the environment or the API) and forks of this test.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "spyglass/profiler.h"
#include "test_util.h"

namespace prof = spyglass::profiler;
namespace fs = std::filesystem;
using spyglass::testing::Events;
using spyglass::testing::FindPlane;
using spyglass::testing::MakeTempDir;
using spyglass::testing::ReadXSpace;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizersTakeSigsegv = true;
#else
constexpr bool kSanitizersTakeSigsegv = false;
#endif

// A ring of 30 s (8 MiB), dumped on SIGUSR1 when `dump_signal`.
prof::TraceOptions RingOptions(bool dump_signal = false) {
  prof::TraceOptions t;
  t.profiler_options.ring_buffer_seconds = 30;
  t.profiler_options.ring_buffer_bytes = 8 << 20;
  if (dump_signal) t.profiler_options.advanced_configuration.emplace("spyglass_dump_signal", "SIGUSR1");
  return t;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs under log_dir/plugins/profile (directories).
std::vector<std::string> Runs(const std::string& log_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(log_dir + "/plugins/profile", ec))
    if (e.is_directory()) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Everything in log_dir/plugins/profile that is not a directory (a crash
// file left behind).
std::vector<std::string> Leftovers(const std::string& log_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(log_dir + "/plugins/profile", ec))
    if (!e.is_directory()) out.push_back(e.path().filename().string());
  return out;
}

// The run a crash dump made ("" if none).
std::string CrashRun(const std::string& log_dir) {
  for (const auto& run : Runs(log_dir))
    if (run.find("_crash_") != std::string::npos) return run;
  return {};
}

std::string XPlaneIn(const std::string& run) {
  for (const auto& e : fs::directory_iterator(run))
    if (e.path().string().ends_with(".xplane.pb")) return e.path().string();
  return {};
}

bool HasEvent(const std::string& run, const std::string& name) {
  std::string x = XPlaneIn(run);
  if (x.empty()) return false;
  auto space = ReadXSpace(x);
  const auto* host = FindPlane(space, "/host:CPU");
  if (host == nullptr) return false;
  for (const auto& e : Events(*host))
    if (e.name == name) return true;
  return false;
}

struct Result {
  int status = 0;
  std::string out, err;
};

// Runs the child with `args` and the environment `env` added (SPYGLASS_*
// cleared first); stdout and stderr go to files (stdout fully buffered).
Result RunChild(const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
  std::string dir = MakeTempDir();
  std::string out = dir + "/stdout", err = dir + "/stderr";
  pid_t pid = fork();
  if (pid == 0) {
    for (const char* v : {"SPYGLASS_TRACE_DIR", "SPYGLASS_SERVER_PORT", "SPYGLASS_FLIGHT_RECORDER", "SPYGLASS_OPTIONS"})
      unsetenv(v);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    if (!freopen(out.c_str(), "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(120);
    // Room above 1023 for the profiler's descriptors where the hard limit allows.
    struct rlimit lim {};
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 4096 && lim.rlim_max > lim.rlim_cur) {
      lim.rlim_cur = lim.rlim_max < 4096 ? lim.rlim_max : 4096;
      setrlimit(RLIMIT_NOFILE, &lim);
    }
    std::vector<char*> argv{const_cast<char*>(SPYGLASS_HOSTILE_CHILD)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(121);
  }
  Result r;
  waitpid(pid, &r.status, 0);
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

std::string Describe(const Result& r) {
  std::string s = WIFEXITED(r.status)   ? "exit " + std::to_string(WEXITSTATUS(r.status))
                  : WIFSIGNALED(r.status) ? "signal " + std::to_string(WTERMSIG(r.status))
                                          : "status " + std::to_string(r.status);
  return s + "\n--- stdout:\n" + r.out + "--- stderr:\n" + r.err;
}

// A program started with the flight recorder that dumped once (by its
// signal) exits as it would have: status 0, its unflushed output written,
// and the last window written at exit (the exit-time stop touched no
// destroyed static).
TEST(FlightRecorderHostile, ExitAfterADumpKeepsStatusOutputAndLastWindow) {
  std::string dir = MakeTempDir();
  Result r = RunChild({"exit_after_dump", dir}, {{"SPYGLASS_FLIGHT_RECORDER", "30"},
                                                 {"SPYGLASS_TRACE_DIR", dir},
                                                 {"SPYGLASS_OPTIONS", "spyglass_dump_signal=SIGUSR1"}});
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << Describe(r);
  EXPECT_EQ(r.out, "unflushed line from the program\n") << Describe(r);
  auto runs = Runs(dir);
  ASSERT_EQ(runs.size(), 2u) << Describe(r);  // the dump, then the last window at exit
  EXPECT_FALSE(HasEvent(runs[0], "after_dump"));
  EXPECT_TRUE(HasEvent(runs[1], "after_dump")) << runs[1];
  EXPECT_NE(r.err.find("flight recorder's last window written to"), std::string::npos) << Describe(r);
  EXPECT_TRUE(Leftovers(dir).empty());
}

void ExitWith42(int) { _exit(42); }
void CountUsr1(int) {}

// stop_trace gives back only the dispositions still the recorder's: a crash
// handler and a dump-signal handler the program installed while it ran stay.
TEST(FlightRecorderHostile, StopKeepsTheProgramsOwnHandlers) {
  if (kSanitizersTakeSigsegv) GTEST_SKIP() << "the sanitizers handle SIGSEGV themselves";
  std::string dir = MakeTempDir();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!prof::start_trace(dir, RingOptions(/*dump_signal=*/true)).ok()) _exit(3);
    signal(SIGSEGV, ExitWith42);
    signal(SIGUSR1, CountUsr1);
    if (!prof::stop_trace().ok()) _exit(4);
    struct sigaction sa {};
    sigaction(SIGUSR1, nullptr, &sa);
    if (sa.sa_handler != CountUsr1) _exit(5);
    sigaction(SIGBUS, nullptr, &sa);  // one the program left alone: back to the default
    if (sa.sa_handler != SIG_DFL) _exit(6);
    *static_cast<volatile int*>(nullptr) = 1;
    _exit(7);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 42);
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return 0;
  return st.st_mode;
}

// Without SPYGLASS_TRACE_DIR the recorder writes under <tmp>/spyglass-<uid>/
// flight-recorder, both made mode 0700; the shared <tmp> itself holds nothing else.
TEST(FlightRecorderHostile, DefaultDirIsPrivateToTheUser) {
  std::string tmp = MakeTempDir();
  Result r = RunChild({"active"}, {{"SPYGLASS_FLIGHT_RECORDER", "30"}, {"TMPDIR", tmp}});
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << Describe(r);
  EXPECT_EQ(r.out, "active: yes\n") << Describe(r);
  std::string user_dir = tmp + "/spyglass-" + std::to_string(geteuid());
  std::string dir = user_dir + "/flight-recorder";
  EXPECT_TRUE(S_ISDIR(ModeOf(user_dir)));
  EXPECT_EQ(ModeOf(user_dir) & 07777, 0700u);
  EXPECT_EQ(ModeOf(dir) & 07777, 0700u);
  EXPECT_EQ(Runs(dir).size(), 1u) << Describe(r);  // the last window, at exit
  std::vector<std::string> in_tmp;
  for (const auto& e : fs::directory_iterator(tmp)) in_tmp.push_back(e.path().filename().string());
  std::sort(in_tmp.begin(), in_tmp.end());
  EXPECT_EQ(in_tmp, std::vector<std::string>{"spyglass-" + std::to_string(geteuid())});
  EXPECT_FALSE(fs::exists(tmp + "/spyglass-flight-recorder"));
}

// A default directory that others may write, or that another user owns (made
// first by someone else), is refused with its name; nothing is written there
// and the program runs on, unprofiled.
TEST(FlightRecorderHostile, DefaultDirOfAnotherUserOrWritableByOthersIsRefused) {
  std::string tmp = MakeTempDir();
  std::string user_dir = tmp + "/spyglass-" + std::to_string(geteuid());
  ASSERT_EQ(mkdir(user_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(user_dir.c_str(), 0777), 0);
  Result r = RunChild({"active"}, {{"SPYGLASS_FLIGHT_RECORDER", "30"}, {"TMPDIR", tmp}});
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << Describe(r);
  EXPECT_EQ(r.out, "active: no\n") << Describe(r);
  EXPECT_NE(r.err.find(user_dir + " is writable by other users (mode 0777)"), std::string::npos) << Describe(r);
  EXPECT_TRUE(fs::is_empty(user_dir));

  // Its own flight-recorder directory writable by others: refused too.
  ASSERT_EQ(chmod(user_dir.c_str(), 0700), 0);
  ASSERT_EQ(mkdir((user_dir + "/flight-recorder").c_str(), 0700), 0);
  ASSERT_EQ(chmod((user_dir + "/flight-recorder").c_str(), 0757), 0);
  r = RunChild({"active"}, {{"SPYGLASS_FLIGHT_RECORDER", "30"}, {"TMPDIR", tmp}});
  EXPECT_EQ(r.out, "active: no\n") << Describe(r);
  EXPECT_NE(r.err.find(user_dir + "/flight-recorder is writable by other users"), std::string::npos) << Describe(r);
  EXPECT_TRUE(fs::is_empty(user_dir + "/flight-recorder"));

  if (geteuid() != 0) GTEST_SKIP() << "another user's directory needs root to make";
  ASSERT_EQ(chmod((user_dir + "/flight-recorder").c_str(), 0700), 0);
  ASSERT_EQ(chown(user_dir.c_str(), 65534, 65534), 0);  // nobody's, mode 0700
  r = RunChild({"active"}, {{"SPYGLASS_FLIGHT_RECORDER", "30"}, {"TMPDIR", tmp}});
  EXPECT_EQ(r.out, "active: no\n") << Describe(r);
  EXPECT_NE(r.err.find(user_dir + " belongs to uid 65534, not to this user"), std::string::npos) << Describe(r);
  EXPECT_TRUE(fs::is_empty(user_dir + "/flight-recorder"));
}

// Whether the daemon child may keep the recorder's descriptors above 1023
// (it raises its soft limit up to 4096 when the hard limit allows).
bool HighDescriptorsPossible() {
  struct rlimit r {};
  return getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_max > 1024 + 64;
}

// A run of the daemon child, in a fresh log dir with a fresh log.
struct DaemonRun {
  std::string dir = MakeTempDir(), log = MakeTempDir() + "/daemon.log";
  Result r;
};
DaemonRun RunDaemon(const std::string& how) {
  DaemonRun d;
  d.r = RunChild({"daemon", d.dir, d.log, how}, {});
  return d;
}

// It died of SIGSEGV, and its log holds its own line alone.
::testing::AssertionResult CrashedWithItsLogUnchanged(const DaemonRun& d) {
  if (!WIFSIGNALED(d.r.status) || WTERMSIG(d.r.status) != SIGSEGV) return ::testing::AssertionFailure() << Describe(d.r);
  if (std::string log = ReadFile(d.log); log != "daemon started\n")
    return ::testing::AssertionFailure() << "its log: '" << log << "'\n" << Describe(d.r);
  return ::testing::AssertionSuccess();
}

// The crash dump of the daemon child went to a run of its own, which holds
// the annotation open at the crash.
void ExpectCrashRun(const std::string& dir, const Result& r) {
  std::string crash_run = CrashRun(dir);
  ASSERT_FALSE(crash_run.empty()) << Describe(r);
  EXPECT_TRUE(HasEvent(crash_run, "open_at_crash"));
}

// A daemon closes descriptors 3..1023 after the recorder started and opens
// its log at 3..20: the dump signal writes nothing into the log, and the
// recorder, whose descriptors sit above 1023, still dumps.
TEST(FlightRecorderHostile, DaemonLogUnchangedByTheDumpSignal) {
  DaemonRun d = RunDaemon("signal");
  const std::string& dir = d.dir;
  const Result& r = d.r;
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << Describe(r);
  EXPECT_EQ(ReadFile(d.log), "daemon started\n") << Describe(r);
  if (HighDescriptorsPossible()) {
    EXPECT_EQ(r.out, "dumped by the signal: yes\n") << Describe(r);
    EXPECT_EQ(Runs(dir).size(), 2u) << Describe(r);  // the dump, then stop_trace's
  }
  EXPECT_TRUE(Leftovers(dir).empty());
}

// The same daemon crashes: the crash dump goes to its run, not into the log.
TEST(FlightRecorderHostile, DaemonLogUnchangedByACrash) {
  if (kSanitizersTakeSigsegv) GTEST_SKIP() << "the sanitizers handle SIGSEGV themselves";
  DaemonRun d = RunDaemon("crash");
  ASSERT_TRUE(CrashedWithItsLogUnchanged(d));
  if (HighDescriptorsPossible()) ExpectCrashRun(d.dir, d.r);
  EXPECT_TRUE(Leftovers(d.dir).empty());
}

// A daemon that puts its log on every descriptor it has, the recorder's
// included: nothing is written into the log or read from it; the dump
// request is dropped and the crash dump not written, each said on stderr;
// no file or empty run is left behind.
TEST(FlightRecorderHostile, DaemonThatTakesEveryDescriptorKeepsItsLog) {
  if (kSanitizersTakeSigsegv) GTEST_SKIP() << "the sanitizers handle SIGSEGV themselves";
  DaemonRun d = RunDaemon("steal");
  ASSERT_TRUE(CrashedWithItsLogUnchanged(d));
  const std::string& dir = d.dir;
  const Result& r = d.r;
  EXPECT_EQ(r.out, "dumped by the signal: no\n") << Describe(r);
  EXPECT_NE(r.err.find("the flight recorder's crash dump is not written: the program closed or reused the "
                       "descriptor of the profile directory"),
            std::string::npos)
      << Describe(r);
  EXPECT_TRUE(Runs(dir).empty()) << Describe(r);
  EXPECT_TRUE(Leftovers(dir).empty());
}

// A daemon that took only the crash file's descriptor: the crash dump is
// written into a new file through the directory, and the log is unchanged.
TEST(FlightRecorderHostile, CrashFileTakenOverIsWrittenAnew) {
  if (kSanitizersTakeSigsegv) GTEST_SKIP() << "the sanitizers handle SIGSEGV themselves";
  if (!HighDescriptorsPossible()) GTEST_SKIP() << "RLIMIT_NOFILE's hard limit is at most 1088";
  DaemonRun d = RunDaemon("steal_file");
  ASSERT_TRUE(CrashedWithItsLogUnchanged(d));
  ExpectCrashRun(d.dir, d.r);
  EXPECT_TRUE(Leftovers(d.dir).empty());
}

// Whatever ends the process (_exit, SIGKILL), no crash file is left beside
// the runs.
TEST(FlightRecorderHostile, NoCrashFileLeftByExitOrKill) {
  for (int how = 0; how < 2; ++how) {
    std::string dir = MakeTempDir();
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (!prof::start_trace(dir, RingOptions()).ok()) _exit(3);
      { prof::TraceAnnotation a("work"); }
      if (how == 0) _exit(0);
      raise(SIGKILL);
      _exit(4);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(how == 0 ? WIFEXITED(status) && WEXITSTATUS(status) == 0 : WIFSIGNALED(status)) << status;
    EXPECT_TRUE(Leftovers(dir).empty()) << (how == 0 ? "_exit: " : "SIGKILL: ") << Leftovers(dir)[0];
    EXPECT_TRUE(Runs(dir).empty());
  }
}

// Dumps that fail (files limited to 64 bytes) leave no empty run directory,
// and a crash dump that fails leaves no run and no temporary file.
TEST(FlightRecorderHostile, FailedDumpsLeaveNothingBehind) {
  if (kSanitizersTakeSigsegv) GTEST_SKIP() << "the sanitizers handle SIGSEGV themselves";
  std::string dir = MakeTempDir();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!prof::start_trace(dir, RingOptions()).ok()) _exit(3);
    for (int i = 0; i < 100; ++i) prof::TraceAnnotation a("work", {{"i", i}});
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit small {64, 64};
    if (setrlimit(RLIMIT_FSIZE, &small) != 0) _exit(4);
    for (int i = 0; i < 5; ++i)
      if (prof::dump_flight_recorder().ok()) _exit(5);
    if (!Runs(dir).empty()) _exit(6);
    *static_cast<volatile int*>(nullptr) = 1;
    _exit(7);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV)
      << (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status)) : std::to_string(status));
  EXPECT_TRUE(Runs(dir).empty()) << Runs(dir)[0];
  EXPECT_TRUE(Leftovers(dir).empty()) << Leftovers(dir)[0];
}

#ifdef SPYGLASS_HEAP_LIB
// Under the heap hook, the same daemon: its SIGUSR2 snapshot and its crash
// dump are written, and nothing goes into its log.
TEST(FlightRecorderHostile, DaemonLogUnchangedUnderTheHeapHook) {
  DaemonRun d;
  d.r = RunChild({"heap_daemon", d.dir, d.log}, {{"LD_PRELOAD", SPYGLASS_HEAP_LIB}, {"SPYGLASS_HEAP_PROFILE_DIR", d.dir}});
  ASSERT_TRUE(CrashedWithItsLogUnchanged(d));
  const std::string& dir = d.dir;
  const Result& r = d.r;
  if (HighDescriptorsPossible()) {
    EXPECT_EQ(r.out, "heap snapshot: yes\n") << Describe(r);
    bool raw = false;
    for (const auto& e : fs::directory_iterator(dir)) raw |= e.path().string().ends_with(".signal.raw");
    EXPECT_TRUE(raw) << Describe(r);
  }
}
#endif

}  // namespace
