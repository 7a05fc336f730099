// A known CPU workload for the sampler's tests and benchmark: burn_a, burn_b
// and burn_c burn 50%, 30% and 20% of the process's CPU time, on two
// threads; the second thread sleeps between its rounds. Built without frame
// pointers (the sampler unwinds with .eh_frame CFI). It prints the CPU time
// each function took, measured with the thread's CPU clock: the truth.
//   cpu_workload [SECONDS_OF_CPU]   (default 2)
//   cpu_workload work ROUNDS        a fixed amount of work on one thread (for
//                                   bench/cpu_sampling_bench.py): prints the
//                                   thread's CPU time and the wall time
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

volatile uint64_t g_sink;

// Arithmetic for about 20 us between clock reads (a read is a system call,
// whose time user-space sampling does not see). A macro, not an inline
// function: the time is the burn_* function's own, also for a symbolizer
// that names inlined frames.
#define SPYGLASS_SPIN(x) \
  for (int i = 0; i < 20000; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull

std::atomic<uint64_t> g_ns[3];
std::atomic<uint64_t> g_user_us;  // the threads' own user time (not the profiler's threads')
// Per thread (0 main, 1 worker): user time and time blocked in the kernel,
// what wall mode samples (it cannot see a thread waiting for a CPU).
double g_thread_user_s[2], g_thread_blocked_s[2];

uint64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// At the end of a thread that began at `start_ns`: its user time, and its
// time blocked = its life - its time on a CPU - its time waiting for one
// (/proc/thread-self/schedstat: run ns, run-queue wait ns).
void AddThreadUserTime(int which, uint64_t start_ns) {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  const uint64_t user_us =
      static_cast<uint64_t>(ru.ru_utime.tv_sec) * 1000000 + static_cast<uint64_t>(ru.ru_utime.tv_usec);
  g_user_us += user_us;
  g_thread_user_s[which] = user_us / 1e6;
  unsigned long long run_ns = 0, wait_ns = 0;
  if (FILE* f = std::fopen("/proc/thread-self/schedstat", "r")) {
    if (std::fscanf(f, "%llu %llu", &run_ns, &wait_ns) != 2) run_ns = wait_ns = 0;
    std::fclose(f);
  }
  const double life_ns = static_cast<double>(MonoNs() - start_ns);
  g_thread_blocked_s[which] = std::max(0.0, (life_ns - static_cast<double>(run_ns + wait_ns)) / 1e9);
}

// Each burns `ns` of its thread's CPU time in its own frame.
#define SPYGLASS_BURN(name, which)                             \
  extern "C" __attribute__((noinline)) void name(uint64_t ns) { \
    const uint64_t start = ThreadCpuNs();                      \
    uint64_t x = start, now = start;                           \
    while ((now = ThreadCpuNs()) - start < ns) SPYGLASS_SPIN(x);  \
    g_sink = x;                                                \
    g_ns[which] += now - start;                                \
    asm volatile("" ::: "memory"); /* no tail call */          \
  }
SPYGLASS_BURN(burn_a, 0)
SPYGLASS_BURN(burn_b, 1)
SPYGLASS_BURN(burn_c, 2)

// Per round (ms of CPU): worker 2 a + 1 b + 2 c, then 2 ms asleep; main 3 a +
// 2 b. In all: a 50%, b 30%, c 20%.
void Worker(int rounds) {
  const uint64_t start = MonoNs();
  pthread_setname_np(pthread_self(), "worker");
  for (int r = 0; r < rounds; ++r) {
    burn_a(2000000);
    burn_b(1000000);
    burn_c(2000000);
    timespec ts{0, 2000000};
    nanosleep(&ts, nullptr);
  }
  AddThreadUserTime(1, start);
}

}  // namespace

// The same three functions over fixed work (no clock reads): a profiler's
// cost shows as more time for the same work.
#define SPYGLASS_WORK(name, which)                                     \
  extern "C" __attribute__((noinline)) void name(int blocks) {        \
    uint64_t x = static_cast<uint64_t>(blocks) + which;                \
    for (int b = 0; b < blocks; ++b) SPYGLASS_SPIN(x);                 \
    g_sink = x;                                                        \
    asm volatile("" ::: "memory");                                     \
  }
SPYGLASS_WORK(work_a, 0)
SPYGLASS_WORK(work_b, 1)
SPYGLASS_WORK(work_c, 2)

int FixedWork(int rounds) {
  timespec w0, w1;
  clock_gettime(CLOCK_MONOTONIC, &w0);
  const uint64_t c0 = ThreadCpuNs();
  for (int r = 0; r < rounds; ++r) {
    work_a(50);
    work_b(30);
    work_c(20);
  }
  const uint64_t c1 = ThreadCpuNs();
  clock_gettime(CLOCK_MONOTONIC, &w1);
  std::printf("thread_cpu_seconds %.6f\nwall_seconds %.6f\n", (c1 - c0) / 1e9,
              (w1.tv_sec - w0.tv_sec) + (w1.tv_nsec - w0.tv_nsec) / 1e9);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 2 && std::string(argv[1]) == "work") return FixedWork(std::atoi(argv[2]));
  const uint64_t start = MonoNs();
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  const int rounds = static_cast<int>(seconds * 1e9 / 10e6);  // 10 ms of CPU per round, both threads
  std::thread worker(Worker, rounds);
  for (int r = 0; r < rounds; ++r) {
    burn_a(3000000);
    burn_b(2000000);
  }
  worker.join();  // (main blocks here until the worker is done: wall time, not CPU)
  AddThreadUserTime(0, start);
  const double total = static_cast<double>(g_ns[0] + g_ns[1] + g_ns[2]);
  // User time: what user-space sampling sees (the clock reads are system calls).
  std::printf("burn_a %.4f\nburn_b %.4f\nburn_c %.4f\ncpu_seconds %.6f\nuser_seconds %.6f\n", g_ns[0] / total,
              g_ns[1] / total, g_ns[2] / total, total / 1e9, g_user_us / 1e6);
  // Wall mode's truth: the worker's share of the two threads' user + blocked time.
  const double main_wall = g_thread_user_s[0] + g_thread_blocked_s[0];
  const double worker_wall = g_thread_user_s[1] + g_thread_blocked_s[1];
  std::printf("worker_blocked_seconds %.6f\nmain_blocked_seconds %.6f\nworker_wall_share %.4f\nworker_cpu_share %.4f\n",
              g_thread_blocked_s[1], g_thread_blocked_s[0], worker_wall / (main_wall + worker_wall),
              g_thread_user_s[1] / (g_thread_user_s[0] + g_thread_user_s[1]));
  return 0;
}
