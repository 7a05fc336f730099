// `spyglass memtop`, `memdiff` and `run`: thin clients of src/memory/.
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
#include "memory/pprof.h"
#include "memory/tracker.h"

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

int Run(bool memory, const std::string& trace_dir, const std::string& out_dir, uint64_t sample_bytes,
        const std::string& python_allocator, const std::vector<std::string>& command) {
  if (command.empty()) {
    std::cerr << "spyglass run: no command given (spyglass run [--memory] [--trace DIR] -- <command...>)\n";
    return 2;
  }
  if (!memory && trace_dir.empty()) memory = true;
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
    if (memory) SetPythonEnv(lib, python_allocator);
    if (sample_bytes) setenv("SPYGLASS_HEAP_SAMPLE_BYTES", std::to_string(sample_bytes).c_str(), 1);
    if (!trace_dir.empty()) setenv("SPYGLASS_TRACE_DIR", fs::absolute(trace_dir, ec).c_str(), 1);
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
    std::string prefix = "memory." + std::to_string(pid) + ".";
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().filename().string().rfind(prefix, 0) == 0) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      std::cerr << "spyglass run: no memory snapshot was written (did the program exit through _exit or a signal?)\n";
    } else {
      std::cerr << "spyglass run: memory snapshots:\n";
      for (const std::string& f : files) std::cerr << "  " << f << "\n";
      std::cerr << "Read them with: spyglass memtop " << files.back() << "   or   go tool pprof -top "
                << files.back() << "\n";
    }
  }
  if (!trace_dir.empty()) std::cerr << "spyglass run: trace written under " << trace_dir << "/plugins/profile/\n";
  return code;
}

// The reader's bound: --max-profile-mb, else $SPYGLASS_MAX_PROFILE_MB, else
// the library default (1024 MiB).
constexpr size_t kMaxProfileMbCeiling = size_t{1} << 24;  // 16 TiB: no overflow in MiB -> bytes

bool ReaderOptions(const char* cmd, size_t flag_mb, memory::PprofReadOptions* out) {
  size_t mb = flag_mb;
  if (mb == 0) {
    const char* env = std::getenv("SPYGLASS_MAX_PROFILE_MB");
    if (!env || !*env) return true;
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(env, &end, 10);
    if (errno || *end || env[0] == '-' || v == 0 || v > kMaxProfileMbCeiling) {
      std::cerr << "spyglass " << cmd << ": SPYGLASS_MAX_PROFILE_MB must be a number of MiB from 1 to "
                << kMaxProfileMbCeiling << ", not '" << std::string(env).substr(0, 40) << "'\n";
      return false;
    }
    mb = static_cast<size_t>(v);
  }
  out->max_bytes = mb << 20;
  return true;
}

}  // namespace

void AddMemoryCommands(CLI::App& app) {
  auto* top = app.add_subcommand("memtop", "Top holders of live memory in a pprof memory profile, by call site");
  static std::string top_file;
  static size_t top_n = 20;
  top->add_option("profile", top_file, "memory profile (.prof, gzipped pprof)")->required();
  top->add_option("-n,--top", top_n, "how many call sites to print")->default_val(20);
  static size_t max_mb = 0;
  auto max_mb_option = [](CLI::App* cmd) {
    cmd->add_option("--max-profile-mb", max_mb,
                    "refuse a profile that needs more than this many MiB once decompressed and parsed "
                    "(default 1024, or $SPYGLASS_MAX_PROFILE_MB)")
        ->check(CLI::Range(size_t{1}, kMaxProfileMbCeiling));
  };
  max_mb_option(top);
  top->callback([] {
    memory::PprofProfile p;
    memory::PprofReadOptions opts;
    if (!ReaderOptions("memtop", max_mb, &opts)) std::exit(2);
    if (Status s = memory::ReadPprofFile(top_file, &p, opts); !s.ok()) {
      std::cerr << "spyglass memtop: " << s.message() << "\n";
      std::exit(1);
    }
    std::cout << memory::MemTopReport(p, top_file, top_n);
  });

  auto* diff = app.add_subcommand("memdiff", "What grew between two memory profiles, by call site (bytes and count)");
  static std::string base_file, cur_file;
  static size_t diff_n = 20;
  diff->add_option("early", base_file, "the earlier profile")->required();
  diff->add_option("late", cur_file, "the later profile")->required();
  diff->add_option("-n,--top", diff_n, "how many call sites to print")->default_val(20);
  max_mb_option(diff);
  diff->callback([] {
    memory::PprofProfile a, b;
    memory::PprofReadOptions opts;
    if (!ReaderOptions("memdiff", max_mb, &opts)) std::exit(2);
    for (auto [file, prof] : {std::pair{&base_file, &a}, std::pair{&cur_file, &b}}) {
      if (Status s = memory::ReadPprofFile(*file, prof, opts); !s.ok()) {
        std::cerr << "spyglass memdiff: " << s.message() << "\n";
        std::exit(1);
      }
    }
    std::cout << memory::MemDiffReport(a, b, base_file, cur_file, diff_n);
  });

  auto* run = app.add_subcommand("run", "Run a program with the heap hook preloaded; write memory snapshots on exit "
                                        "and on SIGUSR2, and a trace if asked. Python programs (python3 script.py, "
                                        "also through a launcher script) get Python frames (function, file, line) "
                                        "interleaved with native ones");
  static bool memory = false;
  static std::string trace_dir, out_dir = ".";
  static std::string sample_bytes = "0";
  static std::vector<std::string> command;
  run->add_flag("--memory", memory, "track the heap (default when --trace is not given)");
  run->add_option("--trace", trace_dir, "also record a trace into this log dir (with a live-bytes counter track)");
  run->add_option("-o,--out", out_dir, "where memory.<pid>.exit.prof and memory.<pid>.<n>.prof go")->default_val(".");
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
    std::exit(Run(memory, trace_dir, out_dir, bytes, python_allocator, command));
  });
}

}  // namespace spyglass::cli
