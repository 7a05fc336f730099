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
#include <fstream>
#include <iostream>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include "commands.h"
#include "export/output_file.h"
#include "memory/crash_dump.h"
#include "memory/pprof.h"
#include "memory/timeline_chart.h"
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

// One profile file: memory.<pid>.<comm>.<tag>.<prof|raw>, or the series
// memory.<pid>.<comm>.timeline.tsv (comm may hold dots).
struct ProfileFile {
  std::string name;
  long pid = 0;
  std::string comm, tag, ext;
};
bool ParseProfileName(const std::string& name, ProfileFile* f) {
  if (name.rfind("memory.", 0) != 0) return false;
  size_t a = 7, b = name.find('.', a);
  size_t ext = name.rfind('.');
  if (b == std::string::npos || ext == std::string::npos || ext <= b) return false;
  size_t tag = name.rfind('.', ext - 1);
  if (tag == std::string::npos || tag <= b) return false;
  std::string pid = name.substr(a, b - a);
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) return false;
  *f = {name, std::stol(pid), name.substr(b + 1, tag - b - 1), name.substr(tag + 1, ext - tag - 1),
        name.substr(ext + 1)};
  return f->ext == "prof" || f->ext == "raw" || (f->ext == "tsv" && f->tag == "timeline");
}

// Live bytes in a profile (the sum of space/bytes); -1 if unreadable.
int64_t LiveBytes(const std::string& path) {
  memory::PprofProfile p;
  if (!memory::ReadPprofFile(path, &p).ok() || p.bytes_index < 0) return -1;
  int64_t total = 0;
  for (const memory::PprofSample& s : p.samples)
    if (static_cast<size_t>(p.bytes_index) < s.values.size()) total += s.values[p.bytes_index];
  return total;
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// What one process left: its files and how it ended.
struct ProcessReport {
  long pid = 0;
  std::string comm;
  std::vector<std::string> files;
  int64_t peak = -1, exit = -1;  // exit: at exit, or in the dump of a dying process
  int dump_signal = 0;
  std::string ended;
};

// Turns the raw dumps of dying processes (crash_dump.h) into pprof profiles
// beside them; the dump goes once converted.
void ConvertDump(const exporter::OutputDir& out, const ProfileFile& f, ProcessReport* r) {
  std::string raw;
  std::error_code ec;
  // Dumps are the tracker's tables: bounded as the profile readers are.
  if (uintmax_t size = fs::file_size(out.PathOf(f.name), ec); ec || size > memory::kDefaultMaxProfileBytes) {
    std::cerr << "spyglass run: " << out.PathOf(f.name) << ": "
              << (ec ? ec.message() : "over " + std::to_string(memory::kDefaultMaxProfileBytes >> 20) + " MiB")
              << "; left as it is\n";
    r->files.push_back(f.name);
    return;
  }
  {
    std::ifstream in(out.PathOf(f.name), std::ios::binary);
    raw.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string pprof;
  memory::internal::DumpSummary sum;
  Status s = memory::internal::ConvertCrashDump(raw, &pprof, &sum);
  std::string name = f.name.substr(0, f.name.size() - 3) + "prof";
  if (s.ok()) s = out.WriteBytes(name, pprof);
  if (!s.ok()) {
    std::cerr << "spyglass run: " << out.PathOf(f.name) << ": " << s.message() << "\n";
    r->files.push_back(f.name);
    return;
  }
  unlinkat(out.fd(), f.name.c_str(), 0);
  r->files.push_back(name);
  if (r->exit < 0) r->exit = sum.live_bytes;
  std::string what;
  if (sum.reason == memory::internal::DumpReason::kOutOfMemory) {
    what = "out of memory: an allocation of " + memory::HumanBytes(static_cast<int64_t>(sum.failed_bytes)) +
           " failed" + (sum.failed_site.empty() ? "" : " in " + sum.failed_site);
  } else {
    r->dump_signal = sum.signal;
    what = "killed by " + SignalName(sum.signal) + " (snapshot at the signal)";
  }
  r->ended = r->ended.empty() ? what : r->ended + "; " + what;
}

constexpr const char* kNearCgroupLimit = "passed 90% of its cgroup memory limit";

// The closing summary: each process that left profiles, the program first.
// Returns the program's timeline file, if it wrote one.
std::string Summarize(const std::string& dir, pid_t main_pid, int status,
                      const std::map<std::string, fs::file_time_type>& before) {
  exporter::OutputDir out;
  if (Status s = exporter::OutputDir::Open(dir, &out); !s.ok()) {
    std::cerr << "spyglass run: " << s.message() << "\n";
    return "";
  }
  std::map<long, ProcessReport> procs;
  std::vector<ProfileFile> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    ProfileFile f;
    if (!ParseProfileName(e.path().filename().string(), &f)) continue;
    auto old = before.find(f.name);
    if (old != before.end() && old->second == e.last_write_time(ec)) continue;  // from an earlier run
    files.push_back(f);
  }
  // Dumps first: a .raw becomes a .prof of the same stem.
  std::sort(files.begin(), files.end(), [](const ProfileFile& a, const ProfileFile& b) {
    return std::make_tuple(a.pid, a.ext != "raw", a.name) < std::make_tuple(b.pid, b.ext != "raw", b.name);
  });
  for (const ProfileFile& f : files) {
    ProcessReport& r = procs[f.pid];
    r.pid = f.pid;
    r.comm = f.comm;
    if (f.ext == "raw") {
      ConvertDump(out, f, &r);
      continue;
    }
    if (std::find(r.files.begin(), r.files.end(), f.name) != r.files.end()) continue;
    r.files.push_back(f.name);
    if (f.tag == "exit") r.exit = LiveBytes(out.PathOf(f.name));
    if (f.tag == "peak") r.peak = LiveBytes(out.PathOf(f.name));
    if (f.tag == "cgroup") r.ended = r.ended.empty() ? kNearCgroupLimit : r.ended + "; " + kNearCgroupLimit;
  }
  if (procs.empty()) {
    std::cerr << "spyglass run: no memory profile was written (did the program exit through _exit, or was it "
                 "killed by SIGKILL?)\n";
    return "";
  }
  for (auto& [pid, r] : procs) {
    if (pid == main_pid) {
      std::string how = WIFEXITED(status)     ? "exit status " + std::to_string(WEXITSTATUS(status))
                        : WIFSIGNALED(status) ? "killed by " + SignalName(WTERMSIG(status))
                                              : "";
      if (WIFSIGNALED(status) && WTERMSIG(status) == r.dump_signal) how.clear();  // the dump says it
      r.ended = r.ended.empty() ? how : how.empty() ? r.ended : how + "; " + r.ended;
    } else if (r.ended.empty()) {
      r.ended = r.exit >= 0 ? "exited" : "";
    }
  }
  std::vector<ProcessReport*> order;
  if (procs.count(main_pid)) order.push_back(&procs[main_pid]);
  for (auto& [pid, r] : procs)
    if (pid != main_pid) order.push_back(&r);
  auto bytes = [](int64_t b) { return b < 0 ? std::string("-") : memory::HumanBytes(b); };
  std::cerr << "spyglass run: memory profiles in " << dir << "/ (" << procs.size()
            << (procs.size() == 1 ? " process" : " processes") << ")\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-8s %-22s %12s %12s  %s\n", "pid", "program", "peak", "at the end", "how it ended");
  std::cerr << line;
  std::string read_first;
  for (ProcessReport* r : order) {
    std::string prog = r->comm + (r->pid == main_pid ? " (main)" : "");
    std::snprintf(line, sizeof line, "  %-8ld %-22s %12s %12s  %s\n", r->pid, prog.c_str(), bytes(r->peak).c_str(),
                  bytes(r->exit).c_str(), r->ended.c_str());
    std::cerr << line;
    for (const std::string& f : r->files) std::cerr << "           " << f << "\n";
    if (read_first.empty()) {
      // The program's most telling profile: its dump, else the exit snapshot, else any.
      for (const char* tag : {".oom.prof", ".signal.prof", ".exit.prof", ".peak.prof", ".prof"})
        for (const std::string& f : r->files)
          if (read_first.empty() && f.size() > std::strlen(tag) && f.compare(f.size() - std::strlen(tag), std::string::npos, tag) == 0)
            read_first = out.PathOf(f);
    }
  }
  if (!read_first.empty())
    std::cerr << "Read them with: spyglass memtop " << read_first << "   or   go tool pprof -top " << read_first << "\n";
  std::string timeline;
  if (procs.count(main_pid))
    for (const std::string& f : procs[main_pid].files)
      if (f.size() > 13 && f.compare(f.size() - 13, 13, ".timeline.tsv") == 0) timeline = out.PathOf(f);
  if (!timeline.empty())
    std::cerr << "Over time: spyglass memtop --over-time " << timeline << "\n";
  return timeline;
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
  std::map<std::string, fs::file_time_type> before;
  if (memory)
    for (const auto& e : fs::directory_iterator(dir, ec)) before[e.path().filename().string()] = e.last_write_time(ec);
  std::string preload = lib;
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("spyglass run: fork");
    return 2;
  }
  if (pid == 0) {
    setenv("LD_PRELOAD", preload.c_str(), 1);
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
    std::string tsv = Summarize(dir, pid, status, before);
    memory::Timeline t;
    if (timeline && !tsv.empty()) {
      if (Status s = memory::ReadTimelineFile(tsv, &t); s.ok())
        std::cerr << "\n" << memory::TimelineChart(t, tsv);
      else
        std::cerr << "spyglass run: " << s.message() << "\n";
    }
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
  run->add_flag("--memory", memory, "track the heap (default when --trace is not given)");
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
                  "where the profiles go: memory.<pid>.<program>.exit.prof at exit, .<n>.prof on SIGUSR2, "
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
