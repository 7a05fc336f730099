// Server benchmarks (BENCHMARKS.md "## Server"), all figures from one run:
//  1. idle annotation cost without and with a started (idle) profiler server;
//  2. latency from the end of the capture window to the files on disk, for
//     1 million events (server collects, serializes, sends; client writes
//     .xplane.pb and .trace.json.gz);
//  3. a capture of a process with two registered subprocesses vs. alone.
// Usage: server_bench [annotating_server binary]
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "server/client.h"
#include "spyglass/annotation.h"
#include "spyglass/profiler.h"
#include "spyglass/server.h"

extern char** environ;
namespace prof = spyglass::profiler;
using Clock = std::chrono::steady_clock;

static double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

static double IdleNsPerAnnotation() {
  constexpr int kN = 20'000'000;
  double best = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    for (int i = 0; i < kN; ++i) {
      prof::TraceAnnotation a("bench_idle");
      asm volatile("" ::: "memory");
    }
    best = std::min(best, Ms(Clock::now() - t0) * 1e6 / kN);
  }
  return best;
}

static std::string TempDir() {
  std::string t = (std::filesystem::temp_directory_path() / "spyglass-srvbench-XXXXXX").string();
  return mkdtemp(t.data()) ? t : "/tmp";
}

// Capture `duration_ms` of this process; returns ms from the window's end to Capture's return.
static double CaptureLatency(uint64_t duration_ms, int events, size_t* bytes) {
  std::string address = "127.0.0.1:" + std::to_string(prof::server_port());
  spyglass::server::CaptureOptions o;
  o.duration_ms = duration_ms;
  spyglass::server::CaptureResult r;
  auto t0 = Clock::now();
  std::thread gen([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int i = 0; i < events; ++i) prof::TraceAnnotation a("bench_event");
  });
  spyglass::Status s = spyglass::server::Capture({address}, o, TempDir(), &r);
  auto t1 = Clock::now();
  gen.join();
  if (!s.ok()) {
    std::fprintf(stderr, "capture failed: %s\n", s.ToString().c_str());
    return -1;
  }
  *bytes = std::filesystem::file_size(r.hosts[0].xplane_path);
  return Ms(t1 - t0) - static_cast<double>(duration_ms);
}

struct Child {
  pid_t pid = 0;
  int port = 0;
};

static Child Spawn(const char* bin) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  std::string b = bin;
  std::vector<char*> argv = {b.data(), const_cast<char*>("0"), const_cast<char*>("--seconds"),
                             const_cast<char*>("120"), nullptr};
  Child c;
  posix_spawn(&c.pid, bin, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  std::string out;
  char ch;
  while (read(fds[0], &ch, 1) == 1 && ch != '\n') out.push_back(ch);
  close(fds[0]);
  if (out.rfind("PORT ", 0) == 0) c.port = std::stoi(out.substr(5));
  return c;
}

int main(int argc, char** argv) {
  const char* child_bin = argc > 1 ? argv[1] : ANNOTATING_SERVER;
  double no_server = IdleNsPerAnnotation();
  if (!prof::start_server(0).ok()) return 1;
  double idle_server = IdleNsPerAnnotation();
  std::printf("idle annotation, no server:        %.2f ns\n", no_server);
  std::printf("idle annotation, idle server:      %.2f ns\n", idle_server);

  size_t bytes = 0;
  std::vector<double> lat;
  for (int rep = 0; rep < 3; ++rep) lat.push_back(CaptureLatency(1000, 1'000'000, &bytes));
  std::sort(lat.begin(), lat.end());
  std::printf("1M events: window end -> files on disk: median %.0f ms (min %.0f, max %.0f), xplane %.1f MB\n",
              lat[1], lat[0], lat[2], bytes / 1e6);

  std::vector<double> alone, with_children;
  for (int rep = 0; rep < 3; ++rep) alone.push_back(CaptureLatency(500, 10000, &bytes));
  Child a = Spawn(child_bin), b = Spawn(child_bin);
  prof::SubprocessRegistration ra, rb;
  if (!prof::register_subprocess(a.pid, a.port, &ra, 5000).ok() ||
      !prof::register_subprocess(b.pid, b.port, &rb, 5000).ok()) {
    std::fprintf(stderr, "cannot register children\n");
    return 1;
  }
  for (int rep = 0; rep < 3; ++rep) with_children.push_back(CaptureLatency(500, 10000, &bytes));
  std::sort(alone.begin(), alone.end());
  std::sort(with_children.begin(), with_children.end());
  std::printf("500 ms capture, one process:       +%.0f ms after the window (median of 3)\n", alone[1]);
  std::printf("500 ms capture, + 2 subprocesses:  +%.0f ms after the window (median of 3), xplane %.1f MB\n",
              with_children[1], bytes / 1e6);
  ra.unregister();
  rb.unregister();
  for (pid_t p : {a.pid, b.pid}) {
    kill(p, SIGKILL);
    waitpid(p, nullptr, 0);
  }
  (void)prof::stop_server();
  return 0;
}
