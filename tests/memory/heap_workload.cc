// A program that knows nothing of Spyglass, for the heap-hook tests:
//   heap_workload grow STEPS   keeps 100 x 1 KiB (grow_cache) per step, plus a
//                              fixed 10 x 64 KiB table (build_table); sends
//                              itself SIGUSR2 after step 1 (snapshot) and exits.
//   heap_workload stress       threads, fork, frees of unknown pointers,
//                              allocations in a signal handler and at thread exit.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

static std::vector<void*>* g_keep = new std::vector<void*>;

__attribute__((noinline)) void grow_cache(int n) {
  for (int i = 0; i < n; ++i) g_keep->push_back(new char[1024]);
}

__attribute__((noinline)) void build_table() {
  for (int i = 0; i < 10; ++i) g_keep->push_back(std::malloc(64 * 1024));
}

__attribute__((noinline)) void churn(int n) {
  for (int i = 0; i < n; ++i) {
    void* p = std::malloc(16 + i % 200);
    std::free(p);
  }
}

static void wait_for_file(const std::string& path) {
  struct stat st;
  for (int i = 0; i < 500 && stat(path.c_str(), &st) != 0; ++i) usleep(10000);
  usleep(50000);
}

static void on_signal(int) {
  // Not async-signal-safe in general; the hook must survive it anyway.
  void* p = std::malloc(77);
  std::free(p);
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "grow";
  if (mode == "grow") {
    int steps = argc > 2 ? std::atoi(argv[2]) : 5;
    build_table();
    for (int s = 1; s <= steps; ++s) {
      grow_cache(100);
      churn(1000);
      if (s == 1) {
        if (const char* dir = std::getenv("SPYGLASS_HEAP_PROFILE_DIR")) {
          raise(SIGUSR2);
          wait_for_file(std::string(dir) + "/memory." + std::to_string(getpid()) + ".heap_workload.1.prof");
        }
      }
    }
    std::printf("grow: done\n");
    return 0;
  }
  if (mode == "stress") {
    signal(SIGALRM, on_signal);
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([&, t] {
        thread_local std::string tls_string(100 + t, 'x');  // freed at thread exit
        std::vector<void*> mine;
        for (int i = 0; i < 20000; ++i) {
          mine.push_back(std::malloc(8 + (i * 7) % 500));
          if (mine.size() > 100) {
            std::free(mine.front());
            mine.erase(mine.begin());
          }
        }
        for (void* p : mine) std::free(p);
        (void)tls_string.size();
      });
    for (int i = 0; i < 50; ++i) {
      kill(getpid(), SIGALRM);
      usleep(1000);
    }
    pid_t pid = fork();
    if (pid == 0) {
      churn(10000);
      grow_cache(10);
      _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    for (auto& th : threads) th.join();
    std::printf("stress: child %s\n", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "ok" : "FAILED");
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
  }
  return 2;
}
