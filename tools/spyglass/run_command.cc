// `spyglass run`: runs a program with the heap hook (libspyglass_heap.so)
// preloaded and reports the memory profiles it wrote. --trace, --server and
// --flight-recorder are the SPYGLASS_* settings (session/env_start.h), checked
// here by the same parser and handed to the program's environment: libspyglass
// (linked, or loaded by the hook) starts them at load.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
#include "session/env_start.h"

namespace spyglass::cli {
namespace {

namespace fs = std::filesystem;

pid_t g_child = 0;
void Forward(int sig) {
  if (g_child > 0) kill(g_child, sig);
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

int Run(bool memory, const Settings& settings, const std::string& out_dir, uint64_t sample_bytes,
        const std::string& python_allocator, bool follow_children, bool timeline,
        const std::vector<std::string>& command) {
  if (command.empty()) {
    std::cerr << "spyglass run: no command given (spyglass run [--memory] [--trace DIR] [--server PORT] "
                 "[--flight-recorder S] -- <command...>)\n";
    return 2;
  }
  session::StartSettings parsed;
  auto get = [&](const char* name) -> const char* {
    for (const auto& [n, v] : settings)
      if (std::strcmp(n, name) == 0) return v.c_str();
    return nullptr;
  };
  if (Status s = session::ParseStartSettings(get, &parsed); !s.ok()) {
    std::cerr << "spyglass run: " << s.message() << "\n";
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
  std::string preload = lib;
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("spyglass run: fork");
    return 2;
  }
  // A Python interpreter without --memory: the spyglass package starts the
  // settings at interpreter start (its spyglass-autostart.pth), with the
  // Python tracer; libspyglass loaded by the hook would write a second run.
  std::string prog = fs::path(command[0]).filename().string();
  bool python = prog.rfind("python", 0) == 0 && prog.find_first_not_of("python0123456789.") == std::string::npos;
  if (pid == 0) {
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
    execvp(argv[0], argv.data());
    std::cerr << "spyglass run: cannot run " << command[0] << ": " << std::strerror(errno) << "\n";
    _exit(127);
  }
  g_child = pid;
  struct sigaction sa {};
  sa.sa_handler = Forward;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGUSR2, SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (memory) {
    memory::ProgramEnd end{WIFSIGNALED(status), WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status)};
    std::cerr << memory::SummarizeRun(dir, pid, end, before, timeline);
  }
  return code;
}

}  // namespace

void AddRunCommand(CLI::App& app) {
  auto* run = app.add_subcommand("run", "Run a program with profiling started from outside: a trace (--trace), the "
                                        "profiler server (--server), the flight recorder (--flight-recorder), heap "
                                        "snapshots on exit and on SIGUSR2 (--memory, the default without those; "
                                        "Python programs, also through a launcher script, get Python frames "
                                        "interleaved with native ones); Python programs: python -m spyglass run too");
  static bool memory = false;
  static std::string trace_dir, server, flight_recorder, options, out_dir = ".";
  static std::string sample_bytes = "0";
  static std::vector<std::string> command;
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
                  "where the profiles go: memory.<pid>.<program>.exit.prof and .peak.prof at exit (with the series "
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
  static std::string python_allocator = "pymalloc";
  run->add_option("--python-allocator", python_allocator,
                  "Python programs: 'pymalloc' (default) records Python's objects as Python allocates them; "
                  "'malloc' sets PYTHONMALLOC=malloc, so that every object is a malloc block (slower, more memory, "
                  "but the profile is the process's heap as malloc sees it)")
      ->check(CLI::IsMember({"pymalloc", "malloc"}))
      ->default_val("pymalloc");
  run->add_option("command", command, "the program and its arguments (after --)")->required();
  run->prefix_command();
  run->footer(
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
    if (!trace_dir.empty()) settings.emplace_back(session::kEnvTraceDir, trace_dir);
    if (!server.empty()) settings.emplace_back(session::kEnvServerPort, server);
    if (!flight_recorder.empty()) settings.emplace_back(session::kEnvFlightRecorder, flight_recorder);
    if (!options.empty()) settings.emplace_back(session::kEnvOptions, options);
    std::exit(Run(memory, settings, out_dir, bytes, python_allocator, follow_children, timeline, command));
  });
}

}  // namespace spyglass::cli
