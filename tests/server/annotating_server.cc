// A long-running program for the remote-capture tests: starts the profiler
// server and annotates in a loop until killed or `--seconds` passed.
//   annotating_server <port|0> [--name NAME] [--seconds S] [--child PID:PORT ...] [--busy N]
// --busy N adds N threads that annotate in a tight loop (a busy target for
// the memory tests).
// Prints "PORT <n>" once the server listens (port 0 picks a free one).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "spyglass/annotation.h"
#include "spyglass/profiler.h"
#include "spyglass/server.h"

namespace prof = spyglass::profiler;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <port> [--name NAME] [--seconds S] [--child PID:PORT]\n", argv[0]);
    return 2;
  }
  int port = std::atoi(argv[1]);
  std::string name = "annotating_server_step";
  double seconds = 600;
  std::vector<prof::SubprocessRegistration> children;
  std::vector<std::pair<int, int>> child_args;
  int busy = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--name")) name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--busy")) busy = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--child")) {
      int pid = 0, p = 0;
      std::sscanf(argv[i + 1], "%d:%d", &pid, &p);
      child_args.emplace_back(pid, p);
    }
  }
  if (spyglass::Status s = prof::start_server(port); !s.ok()) {
    std::fprintf(stderr, "start_server: %s\n", s.ToString().c_str());
    return 1;
  }
  for (auto [pid, p] : child_args) {
    prof::SubprocessRegistration r;
    if (spyglass::Status s = prof::register_subprocess(pid, p, &r, 10000); !s.ok()) {
      std::fprintf(stderr, "register_subprocess: %s\n", s.ToString().c_str());
      return 1;
    }
    children.push_back(std::move(r));
  }
  std::printf("PORT %d\n", prof::server_port());
  std::fflush(stdout);
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::thread worker([&] {
    prof::set_thread_name("worker");
    while (std::chrono::steady_clock::now() < end) {
      prof::TraceAnnotation a("worker_task");
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
  });
  std::vector<std::thread> busy_threads;
  for (int i = 0; i < busy; ++i)
    busy_threads.emplace_back([&end, i] {
      prof::set_thread_name("busy_" + std::to_string(i));
      for (int64_t n = 0; std::chrono::steady_clock::now() < end; ++n) {
        prof::TraceAnnotation a("busy_task", {{"n", n}});
      }
    });
  for (int64_t step = 0; std::chrono::steady_clock::now() < end; ++step) {
    prof::StepTraceAnnotation s("train", step);
    prof::TraceAnnotation a(std::string_view(name), {{"step", step}});
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  worker.join();
  for (auto& t : busy_threads) t.join();
  (void)prof::stop_server();
  return 0;
}
