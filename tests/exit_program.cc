// Exit-time behaviour: a program that ends while spyglass is still in use.
//
//   exit_program <log_dir>            trace, stop_trace, then return from main
//                                     while a detached thread still annotates
//   exit_program <log_dir> running    return from main while a session is
//                                     still running (never stopped) and
//                                     threads annotate
//
// In both modes a static object's destructor annotates after main returns.
// The program must exit with status 0: no crash, no hang, no abort.
#include <spyglass/profiler.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

namespace prof = spyglass::profiler;

namespace {

std::atomic<uint64_t> g_iterations{0};

// Annotates forever, as a background worker of a real program would; never
// joined.
void annotate_forever(int id) {
  std::string name = "worker " + std::to_string(id);
  for (uint64_t i = 0;; ++i) {
    prof::TraceAnnotation outer("worker_loop", {{"i", i}, {"id", id}});
    prof::TraceAnnotation inner{std::string_view(name)};
    prof::TraceAnnotation lazy([&] { return name + " lazy"; });
    g_iterations.fetch_add(1, std::memory_order_relaxed);
  }
}

// Runs its destructor after main returns, when the library's own statics may
// be going away too.
struct AnnotatesAtExit {
  ~AnnotatesAtExit() {
    for (int i = 0; i < 100; ++i) {
      prof::TraceAnnotation s("static_destructor", {{"i", i}});
      prof::TraceAnnotation d{std::string("dynamic destructor ") + std::to_string(i)};
      prof::StepTraceAnnotation step("exit_step", i);
    }
    std::fprintf(stderr, "exit_program: static destructor annotated\n");
  }
};
AnnotatesAtExit g_at_exit;

void start_workers(int n) {
  for (int i = 0; i < n; ++i) std::thread(annotate_forever, i).detach();
  // Wait until they really run, so that main returns mid-annotation.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (g_iterations.load(std::memory_order_relaxed) < 1000 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <log_dir> [running]\n", argv[0]);
    return 2;
  }
  const std::string log_dir = argv[1];
  const bool keep_running = argc > 2 && std::strcmp(argv[2], "running") == 0;

  if (auto s = prof::start_trace(log_dir); !s.ok()) {
    std::fprintf(stderr, "start_trace failed: %s\n", s.message().c_str());
    return 1;
  }
  start_workers(keep_running ? 4 : 2);
  for (int64_t i = 0; i < 10; ++i) {
    prof::StepTraceAnnotation step("main_step", i);
    prof::TraceAnnotation a("main_work", {{"i", i}});
    prof::TraceAnnotation b{std::string("main dynamic ") + std::to_string(i)};
  }

  if (keep_running) {
    std::fprintf(stderr, "exit_program: returning with the session still running\n");
    return 0;
  }

  if (auto s = prof::stop_trace(); !s.ok()) {
    std::fprintf(stderr, "stop_trace failed: %s\n", s.message().c_str());
    return 1;
  }
  const prof::TraceFiles files = prof::last_trace_files();
  std::error_code ec;
  if (files.xplane_path.empty() || !std::filesystem::is_regular_file(files.xplane_path, ec)) {
    std::fprintf(stderr, "no xplane.pb written (path '%s')\n", files.xplane_path.c_str());
    return 1;
  }
  std::printf("%s\n", files.xplane_path.c_str());
  // Keep the workers annotating (idle now) a moment more, then leave.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::fprintf(stderr, "exit_program: returning after stop_trace, workers still annotating\n");
  return 0;
}
