// Known programs for `spyglass run`'s processes, OOM and fatal-signal tests
// (memory_process_test.sh). Every block it keeps comes from a function of its
// own, with a known size:
//   process_tree forkexec   keeps 3 x 100000 B (parent_block), forks and execs
//                           itself as `child`, which keeps 2 x 50000 B
//                           (child_block); the parent waits, then exits 0
//   process_tree child      the child's part alone
//   process_tree oom        keeps 1 MiB blocks (grab_block) until malloc
//                           returns NULL, then abort()s
//   process_tree oomcalloc  the same through calloc (calloc_block); says
//                           whether errno was ENOMEM after the failure
//   process_tree oomsmall   keeps 4 KiB blocks (small_block) until malloc
//                           returns NULL, then abort()s
//   process_tree oomsetrlimit  the same under an address-space limit that it
//                           sets itself (setrlimit): 64 MiB above its size
//   process_tree errno      says whether errno is what libc left it after a
//                           failing setrlimit and across 300 ms of mallocs
//   process_tree crash      keeps 4 x 25000 B (crash_block), then writes
//                           through a null pointer (SIGSEGV)
//   process_tree workers    forks 3 workers (no exec) that wait; SIGTERMs
//                           them (as a pool's terminate() does), reaps them,
//                           then exits 0
//   process_tree live N [term]  keeps N blocks of 16-527 B (live_block), then
//                           exits 0 or, with `term`, raises SIGTERM (the
//                           dump's cost, BENCHMARKS.md)
//   process_tree cgroup N S keeps and touches 1 MiB blocks (grab_block) up to
//                           N MiB, 5 ms apart up to S MiB and 100 ms apart
//                           after that, then exits 0
//   process_tree spike N H  keeps and touches N MiB (grab_block) at once,
//                           holds them H ms, frees them, waits 700 ms, exits 0
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void* volatile g_keep[4096];
static int g_kept = 0;

__attribute__((noinline)) static void keep(void* p) {
  if (g_kept < 4096) g_keep[g_kept++] = p;
}
__attribute__((noinline)) void parent_block(void) { keep(malloc(100000)); }
__attribute__((noinline)) void child_block(void) { keep(malloc(50000)); }
__attribute__((noinline)) void crash_block(void) { keep(malloc(25000)); }
__attribute__((noinline)) void* live_block(int i) { return malloc(16 + (size_t)(i % 512)); }
__attribute__((noinline)) int grab_block(int touch) {
  char* p = malloc(1 << 20);
  if (!p) return 0;
  if (touch) memset(p, 1, 1 << 20);
  keep(p);
  return 1;
}

// Below the size the heap hook's sampled mode checks on every call (64 KiB).
__attribute__((noinline)) int small_block(void) {
  char* p = malloc(4096);
  if (!p) return 0;
  keep(p);
  return 1;
}

__attribute__((noinline)) int calloc_block(void) {
  char* p = calloc(1, 1 << 20);
  if (!p) return 0;
  keep(p);
  return 1;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (strcmp(mode, "child") == 0) {
    for (int i = 0; i < 2; ++i) child_block();
    printf("child: %d done\n", (int)getpid());
    return 0;
  }
  if (strcmp(mode, "forkexec") == 0) {
    for (int i = 0; i < 3; ++i) parent_block();
    fflush(stdout);
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    pid_t pid = fork();
    if (pid == 0) {
      execl(self, argv[0], "child", (char*)NULL);
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("forkexec: %d child %d status %d\n", (int)getpid(), (int)pid, status);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  }
  if (strcmp(mode, "live") == 0) {
    int n = argc > 2 ? atoi(argv[2]) : 0;
    static void* blocks[1 << 20];
    for (int i = 0; i < n && i < (1 << 20); ++i) blocks[i] = live_block(i);
    if (argc > 3 && strcmp(argv[3], "term") == 0) raise(SIGTERM);
    return 0;
  }
  if (strcmp(mode, "workers") == 0) {
    pid_t kids[3];
    for (int i = 0; i < 3; ++i) {
      kids[i] = fork();
      if (kids[i] == 0) {
        child_block();
        for (int k = 0; k < 3000; ++k) {  // 30 s at most: the parent ends it long before
          struct timespec ts = {0, 10 * 1000 * 1000};
          nanosleep(&ts, NULL);
        }
        _exit(0);
      }
    }
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    int killed = 0;
    for (int i = 0; i < 3; ++i) {
      kill(kids[i], SIGTERM);
      int status = 0;
      waitpid(kids[i], &status, 0);
      killed += WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM;
    }
    printf("workers: %d killed by SIGTERM\n", killed);
    return 0;
  }
  if (strcmp(mode, "oom") == 0) {
    int n = 0;
    while (n < 1 << 20 && grab_block(0)) ++n;
    printf("oom: malloc failed after %d MiB\n", n);
    fflush(stdout);
    abort();
  }
  if (strcmp(mode, "oomcalloc") == 0) {
    int n = 0;
    errno = 0;
    while (n < 1 << 20 && calloc_block()) ++n;
    printf("oomcalloc: calloc failed after %d MiB, errno %s\n", n, errno == ENOMEM ? "ENOMEM" : "not ENOMEM");
    fflush(stdout);
    abort();
  }
  if (strcmp(mode, "oomsetrlimit") == 0) {
    // 64 MiB more than it maps now: few enough allocations that a sampled
    // run rarely reaches a sample point (where the hook reads the limits
    // again) before the failure; the hooked setrlimit must see it.
    unsigned long pages = 0;
    FILE* statm = fopen("/proc/self/statm", "r");
    if (!statm || fscanf(statm, "%lu", &pages) != 1) return 1;
    fclose(statm);
    struct rlimit r;
    if (getrlimit(RLIMIT_AS, &r) != 0) return 1;
    r.rlim_cur = pages * (unsigned long)sysconf(_SC_PAGESIZE) + (64ul << 20);
    if (setrlimit(RLIMIT_AS, &r) != 0) {
      perror("setrlimit");
      return 1;
    }
    mode = "oomsmall";
  }
  if (strcmp(mode, "oomsmall") == 0) {
    int n = 0;
    while (n < 1 << 30 && small_block()) ++n;
    printf("oomsmall: malloc failed after %d blocks\n", n);
    fflush(stdout);
    abort();
  }
  if (strcmp(mode, "errno") == 0) {
    struct rlimit r = {RLIM_INFINITY, RLIM_INFINITY};
    errno = 0;
    int rc = setrlimit((__rlimit_resource_t)1000, &r);  // no such resource: EINVAL
    printf("errno: setrlimit %d %s\n", rc, errno == EINVAL ? "EINVAL" : strerror(errno));
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    errno = 0;
    long calls = 0;
    do {
      void* volatile p = malloc(64);
      free(p);
      ++calls;
      clock_gettime(CLOCK_MONOTONIC, &t);
    } while (errno == 0 && (t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 300000000L);
    printf("errno: after %ld mallocs %s\n", calls, errno == 0 ? "0" : strerror(errno));
    return 0;
  }
  if (strcmp(mode, "crash") == 0) {
    for (int i = 0; i < 4; ++i) crash_block();
    printf("crash: %d\n", (int)getpid());
    fflush(stdout);
    *(volatile int*)(uintptr_t)(argc - argc) = 1;
    return 0;
  }
  if (strcmp(mode, "cgroup") == 0) {
    int mib = argc > 2 ? atoi(argv[2]) : 0, slow = argc > 3 ? atoi(argv[3]) : 0;
    for (int i = 0; i < mib && i < 4096; ++i) {
      if (!grab_block(1)) break;
      struct timespec ts = {0, (i < slow ? 5 : 100) * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    struct timespec ts = {0, 600 * 1000 * 1000};  // the watcher polls 4 times a second
    nanosleep(&ts, NULL);
    printf("cgroup: %d MiB kept\n", g_kept);
    return 0;
  }
  if (strcmp(mode, "spike") == 0) {
    int mib = argc > 2 ? atoi(argv[2]) : 0, hold = argc > 3 ? atoi(argv[3]) : 0;
    for (int i = 0; i < mib && i < 4096; ++i)
      if (!grab_block(1)) break;
    struct timespec ts = {hold / 1000, (long)(hold % 1000) * 1000 * 1000};
    nanosleep(&ts, NULL);
    int kept = g_kept;
    while (g_kept > 0) free(g_keep[--g_kept]);
    struct timespec after = {0, 700 * 1000 * 1000};
    nanosleep(&after, NULL);
    printf("spike: %d MiB held %d ms\n", kept, hold);
    return 0;
  }
  fprintf(stderr, "usage: process_tree forkexec|child|oom|oomcalloc|oomsmall|oomsetrlimit|errno|crash|cgroup N|spike N H\n");
  return 2;
}
