// A program with a flight recorder, for flight_recorder_xprof_test.sh: two
// threads run steps ("train <i>" with "matmul" and "relu" inside) while one
// trigger writes the ring as a run.
//   flight_recorder_child <log_dir> api|signal|slow_step|crash|server
// api: dump_flight_recorder() mid-run. signal: prints "READY" and waits for
// SIGUSR2 (spyglass_dump_signal) from outside. slow_step: one step of 300 ms
// over a 100 ms threshold. crash: dies of SIGSEGV. server: prints "PORT <n>"
// (a profiler server) and runs until stdin closes. Each mode but crash ends
// with stop_trace; exit 0 when its dump was seen.
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "spyglass/profiler.h"

namespace prof = spyglass::profiler;
namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_step{0};

void Step(int i, int sleep_ms = 0) {
  prof::StepTraceAnnotation step("train", i);
  { prof::TraceAnnotation a("matmul", {{"rows", 64}}); std::this_thread::sleep_for(std::chrono::milliseconds(1)); }
  { prof::TraceAnnotation a("relu"); }
  if (sleep_ms) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
}

void Worker() {
  prof::set_thread_name("worker");
  for (int i = 0; !g_stop.load(); ++i) {
    prof::TraceAnnotation a("load_batch", {{"i", i}});
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

size_t Runs(const std::string& log_dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(log_dir + "/plugins/profile", ec)) n += e.is_directory();
  return n;
}

// Runs steps until `done()` or 60 s.
template <class F>
bool StepUntil(F done) {
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    Step(g_step++);
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <log_dir> api|signal|slow_step|crash|server\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1], mode = argv[2];
  prof::TraceOptions t;
  // The server mode's ring keeps the whole run: the capture comes from
  // another process, seconds later on a loaded machine, and must still hold
  // the early step the test looks for.
  const bool whole_run = mode == "server";
  t.profiler_options.ring_buffer_seconds = whole_run ? 120 : 5;
  t.profiler_options.ring_buffer_bytes = whole_run ? 64 << 20 : 8 << 20;
  auto& adv = t.profiler_options.advanced_configuration;
  if (mode == "signal") adv.emplace("spyglass_dump_signal", "SIGUSR2");
  if (mode == "slow_step") adv.emplace("spyglass_dump_if_step_slower_than_ms", 100);
  if (spyglass::Status s = prof::start_trace(dir, t); !s.ok()) {
    std::fprintf(stderr, "start_trace: %s\n", s.ToString().c_str());
    return 1;
  }
  std::thread worker(Worker);
  for (int i = 0; i < 20; ++i) Step(g_step++);
  bool ok = true;
  if (mode == "api") {
    spyglass::Status s = prof::dump_flight_recorder();
    if (!s.ok()) std::fprintf(stderr, "dump_flight_recorder: %s\n", s.ToString().c_str());
    ok = s.ok() && prof::flight_recorder_active();
    for (int i = 0; i < 5; ++i) Step(g_step++);
  } else if (mode == "signal") {
    std::printf("READY\n");
    std::fflush(stdout);
    ok = StepUntil([&] { return Runs(dir) >= 1; });
  } else if (mode == "slow_step") {
    Step(g_step++, 300);
    ok = StepUntil([&] { return Runs(dir) >= 1; });
  } else if (mode == "crash") {
    prof::TraceAnnotation open(std::string_view("open_at_crash"));
    *static_cast<volatile int*>(nullptr) = 1;
  } else if (mode == "server") {
    if (spyglass::Status s = prof::start_server(0); !s.ok()) {
      std::fprintf(stderr, "start_server: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("PORT %d\n", prof::server_port());
    std::fflush(stdout);
    StepUntil([] {
      pollfd p{0, POLLIN, 0};
      return poll(&p, 1, 0) > 0;  // stdin readable: closed (or written)
    });
    (void)prof::stop_server();
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    ok = false;
  }
  g_stop = true;
  worker.join();
  if (spyglass::Status s = prof::stop_trace(); !s.ok()) {
    std::fprintf(stderr, "stop_trace: %s\n", s.ToString().c_str());
    return 1;
  }
  return ok ? 0 : 1;
}
