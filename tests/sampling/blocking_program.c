/* System calls the sampler must leave as they are: a blocking read, a
 * nanosleep, a futex wait, a poll timeout, and the program's own SIGPROF
 * timer. Prints what each returned; exits 3. Run with and without sampling:
 * the same output and status.
 *   blocking_program [no-prof]   (no-prof: without the SIGPROF timer) */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int g_pipe[2];
static atomic_int g_futex;
static volatile sig_atomic_t g_prof_ticks;
static volatile unsigned long g_sink;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void burn(double seconds) {
  double end = now_s() + seconds;
  unsigned long x = 1;
  while (now_s() < end)
    for (int i = 0; i < 10000; ++i) x = x * 6364136223846793005ul + 1;
  g_sink = x;
}

static void* helper(void* arg) {
  (void)arg;
  burn(0.05);
  if (write(g_pipe[1], "hello", 5) != 5) return NULL;
  burn(0.05);
  atomic_store(&g_futex, 1);
  syscall(SYS_futex, &g_futex, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
  return NULL;
}

static void on_prof(int sig) {
  (void)sig;
  ++g_prof_ticks;
}

int main(int argc, char** argv) {
  /* "no-prof": without the program's own SIGPROF timer. */
  const int own_prof = !(argc > 1 && strcmp(argv[1], "no-prof") == 0);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_prof;
  sigaction(SIGPROF, &sa, NULL);
  struct itimerval it = {{0, 10000}, {0, 10000}};

  if (pipe(g_pipe) != 0) return 1;
  pthread_t t;
  pthread_create(&t, NULL, helper, NULL);
  char buf[16] = {0};
  ssize_t n;
  do n = read(g_pipe[0], buf, sizeof buf - 1);
  while (n < 0 && errno == EINTR);
  printf("read %zd '%s'\n", n, buf);
  int r;
  do r = (int)syscall(SYS_futex, &g_futex, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
  while (r != 0 && errno == EINTR && atomic_load(&g_futex) == 0);
  printf("futex woken, value %d\n", atomic_load(&g_futex));
  pthread_join(t, NULL);

  /* No timer of the program's is armed yet: these see no signal of the program's. */
  double t0 = now_s();
  struct timespec ts = {0, 100000000};
  int s = nanosleep(&ts, &ts);
  printf("nanosleep %d errno %d slept_enough %d\n", s, s ? errno : 0, now_s() - t0 >= 0.1);
  struct pollfd p = {g_pipe[0], POLLIN, 0};
  t0 = now_s();
  int pr = poll(&p, 1, 100);
  printf("poll %d errno %d waited_enough %d\n", pr, pr < 0 ? errno : 0, now_s() - t0 >= 0.1);

  /* The program's own timer is armed only now, after its sleeps: ITIMER_PROF
     counts the whole process's CPU time, the sampler's reader's too, so
     armed during a sleep it may fire there (the program's own signal, EINTR;
     docs/sampling.md). Until it fired a few times (CPU time: on a busy
     machine wall time says little), at most 10 s. */
  if (own_prof) setitimer(ITIMER_PROF, &it, NULL);
  double until = now_s() + 10;
  while (own_prof && g_prof_ticks <= 5 && now_s() < until) burn(0.01);
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_PROF, &off, NULL);
  if (own_prof) printf("own SIGPROF timer fired: %s\n", g_prof_ticks > 5 ? "yes" : "no");
  return 3;
}
