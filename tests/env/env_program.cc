// An unmodified program for the start-from-outside tests: linked with
// libspyglass, it annotates and never starts anything itself.
//   env_program [SECONDS]
// Annotates steps ("env_step" around "env_work") until stdin closes or
// SECONDS (default 60) passed; prints "RUNNING" once, then "DONE <steps>".
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "spyglass/annotation.h"

namespace prof = spyglass::profiler;

int main(int argc, char** argv) {
  double seconds = argc > 1 ? std::atof(argv[1]) : 60;
  std::atomic<bool> stop{false};
  std::thread watcher([&] {  // stdin closed (or the parent gone): stop
    char buf[64];
    while (!stop.load()) {
      pollfd p{0, POLLIN, 0};
      if (poll(&p, 1, 50) > 0 && read(0, buf, sizeof buf) <= 0) stop = true;
    }
  });
  std::printf("RUNNING\n");
  std::fflush(stdout);
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  long steps = 0;
  volatile double x = 0;
  while (!stop.load() && std::chrono::steady_clock::now() < end) {
    prof::StepTraceAnnotation step("env_step", steps);
    {
      prof::TraceAnnotation work("env_work");
      for (int i = 0; i < 20000; ++i) x = x + i * 0.5;
    }
    ++steps;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  watcher.join();
  std::printf("DONE %ld\n", steps);
  return 0;
}
