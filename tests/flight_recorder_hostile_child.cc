// A program that treats the flight recorder roughly, for
// flight_recorder_hostile_test.cc. Linked with libspyglass (its constructor
// starts a recorder from SPYGLASS_FLIGHT_RECORDER).
//   flight_recorder_hostile_child exit_after_dump <log_dir>
//     started from the environment with the dump signal SIGUSR1: dumps once
//     by the signal, then prints a line it does not flush and returns 0.
//   flight_recorder_hostile_child heap_daemon <profile_dir> <log>
//     the same daemon under the heap hook: a snapshot by SIGUSR2, then SIGSEGV.
//   flight_recorder_hostile_child daemon <log_dir> <log> signal|crash|steal|steal_file
//     starts a recorder (dump signal SIGUSR1) and then acts as a daemon:
//     closes descriptors 3..1023 and opens its log at 3..20 (every number
//     there names it); "steal" also dup2()s the log onto every other
//     descriptor it has, "steal_file" onto the recorder's crash file only. Writes one line to its log, then gets SIGUSR1
//     (waiting for a run, bounded) and, for crash and steal, dies of SIGSEGV.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "spyglass/profiler.h"

namespace prof = spyglass::profiler;
namespace fs = std::filesystem;

namespace {

// Runs holding their .xplane.pb.
size_t Runs(const std::string& log_dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(log_dir + "/plugins/profile", ec)) {
    if (!e.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(e.path(), ec)) n += f.path().string().ends_with(".xplane.pb");
  }
  return n;
}

// Whether `done()` came true within `seconds` (looked at every 20 ms).
template <class Done>
bool WaitUntil(Done done, int seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool WaitForRuns(const std::string& log_dir, size_t n, int seconds) {
  return WaitUntil([&] { return Runs(log_dir) >= n; }, seconds);
}

// What a daemon does: closes descriptors 3..1023, opens its log at 3 and
// puts it on 4..20 too, and writes its first line. The log's descriptor, or
// -1 (said on stderr).
int OpenLogAsADaemon(const std::string& log) {
  for (int fd = 3; fd < 1024; ++fd) close(fd);
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd != 3) {
    std::fprintf(stderr, "the log opened at %d\n", fd);
    return -1;
  }
  for (int i = 4; i <= 20; ++i) dup2(fd, i);
  const char line[] = "daemon started\n";
  if (write(fd, line, sizeof line - 1) != static_cast<ssize_t>(sizeof line - 1)) return -1;
  return fd;
}

[[noreturn]] void Crash() {
  *static_cast<volatile int*>(nullptr) = 1;
  std::abort();
}

void Steps(int n) {
  for (int i = 0; i < n; ++i) {
    prof::StepTraceAnnotation step("train", i);
    prof::TraceAnnotation a("matmul");
  }
}

int ExitAfterDump(const std::string& dir) {
  if (!prof::flight_recorder_active()) {
    std::fprintf(stderr, "no flight recorder started from the environment\n");
    return 3;
  }
  Steps(5);
  raise(SIGUSR1);
  if (!WaitForRuns(dir, 1, 60)) {
    std::fprintf(stderr, "no dump after SIGUSR1\n");
    return 4;
  }
  { prof::TraceAnnotation a("after_dump"); }
  // Stdout is a file here: fully buffered, flushed by exit() after the
  // profiler's exit handlers ran.
  std::printf("unflushed line from the program\n");
  return 0;
}

// The recorder's descriptors may sit above 1023: the test raised the soft
// limit of open files before it started this program (RunChild).
int Daemon(const std::string& dir, const std::string& log, const std::string& how) {
  prof::TraceOptions t;
  t.profiler_options.ring_buffer_seconds = 30;
  t.profiler_options.ring_buffer_bytes = 8 << 20;
  t.profiler_options.advanced_configuration.emplace("spyglass_dump_signal", "SIGUSR1");
  if (spyglass::Status s = prof::start_trace(dir, t); !s.ok()) {
    std::fprintf(stderr, "start_trace: %s\n", s.ToString().c_str());
    return 3;
  }
  Steps(5);
  int fd = OpenLogAsADaemon(log);
  if (fd < 0) return 3;
  if (how == "steal") {
    std::vector<int> others;
    if (DIR* d = opendir("/proc/self/fd")) {
      while (dirent* e = readdir(d)) {
        int n = std::atoi(e->d_name);
        if (n > 20) others.push_back(n);
      }
      closedir(d);
    }
    for (int n : others) dup2(fd, n);  // the directory's own descriptor is closed by now: harmless
  }
  if (how == "steal_file") {  // only the recorder's crash file (unnamed, or .spyglass_crash_<pid>.tmp)
    for (int n = 21; n < 65536; ++n) {
      char link[64], target[4096];
      std::snprintf(link, sizeof link, "/proc/self/fd/%d", n);
      ssize_t len = readlink(link, target, sizeof target - 1);
      if (len <= 0) continue;
      target[len] = '\0';
      if (std::strstr(target, "(deleted)") || std::strstr(target, ".spyglass_crash_")) dup2(fd, n);
    }
  }
  Steps(5);
  raise(SIGUSR1);
  bool dumped = WaitForRuns(dir, 1, how == "steal" ? 1 : 10);
  std::printf("dumped by the signal: %s\n", dumped ? "yes" : "no");
  std::fflush(stdout);
  if (how == "signal") {
    if (spyglass::Status s = prof::stop_trace(); !s.ok()) std::fprintf(stderr, "stop_trace: %s\n", s.ToString().c_str());
    return 0;
  }
  prof::TraceAnnotation open_at_crash("open_at_crash");
  Crash();
}

// Under the heap hook (LD_PRELOAD, SPYGLASS_HEAP_PROFILE_DIR=dir): the same
// daemon asks for a heap snapshot (SIGUSR2), waits for it (bounded), and dies
// of SIGSEGV (the hook's raw dump).
int HeapDaemon(const std::string& dir, const std::string& log) {
  if (OpenLogAsADaemon(log) < 0) return 3;
  raise(SIGUSR2);
  bool snapshot = WaitUntil(
      [&] {
        free(malloc(100));  // the hook starts its snapshot thread at an allocation
        bool found = false;
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(dir, ec)) found |= e.path().string().ends_with(".1.prof");
        return found;
      },
      10);
  std::printf("heap snapshot: %s\n", snapshot ? "yes" : "no");
  std::fflush(stdout);
  Crash();
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "exit_after_dump" && argc == 3) return ExitAfterDump(argv[2]);
  if (mode == "active" && argc == 2) {
    std::printf("active: %s\n", prof::flight_recorder_active() ? "yes" : "no");
    Steps(3);
    return 0;
  }
  if (mode == "heap_daemon" && argc == 4) return HeapDaemon(argv[2], argv[3]);
  if (mode == "daemon" && argc == 5) return Daemon(argv[2], argv[3], argv[4]);
  std::fprintf(stderr,
               "usage: %s active | exit_after_dump <log_dir> | heap_daemon <dir> <log> |"
               " daemon <log_dir> <log> signal|crash|steal|steal_file\n",
               argv[0]);
  return 2;
}
