/* A program for cli_run_test.py to run under `spyglass run`: it logs each
 * signal it receives, one name a line, in LOG (a write per delivery, from the
 * handler, so that two deliveries are two lines; SIGRTMIN and SIGRTMIN+1 are
 * RT and RT1), writes its pid to READY,
 * and exits 0 on SIGTERM.
 *   run_signal_child LOG READY        wait for signals
 *   run_signal_child abort            die by SIGABRT
 *   run_signal_child exit N           exit with status N */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int log_fd = -1;
static volatile sig_atomic_t done = 0;

static void on_signal(int sig) {
  const char* name = sig == SIGINT    ? "INT\n"
                     : sig == SIGQUIT ? "QUIT\n"
                     : sig == SIGTERM ? "TERM\n"
                     : sig == SIGHUP  ? "HUP\n"
                     : sig == SIGUSR1 ? "USR1\n"
                     : sig == SIGUSR2 ? "USR2\n"
                     : sig == SIGRTMIN ? "RT\n"
                     : sig == SIGRTMIN + 1 ? "RT1\n"
                                      : "OTHER\n";
  if (write(log_fd, name, strlen(name)) < 0) _exit(3);
  if (sig == SIGTERM) done = 1;
}

int main(int argc, char** argv) {
  if (argc >= 2 && strcmp(argv[1], "abort") == 0) abort();
  if (argc >= 3 && strcmp(argv[1], "exit") == 0) return atoi(argv[2]);
  if (argc < 3) {
    fprintf(stderr, "usage: %s LOG READY | abort | exit N\n", argv[0]);
    return 2;
  }
  log_fd = open(argv[1], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return 2;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  /* SIGRTMIN queues each sending (a standard signal sent twice before it is
   * handled counts once), so that a second delivery always shows. */
  int sigs[] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGRTMIN, SIGRTMIN + 1};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; ++i) sigaction(sigs[i], &sa, NULL);
  /* Ready only once the handlers are in place. */
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", argv[2]);
  FILE* f = fopen(tmp, "w");
  if (!f) return 2;
  fprintf(f, "%d\n", (int)getpid());
  fclose(f);
  rename(tmp, argv[2]);
  /* SIGTERM blocked between the check and the wait: none slips in between. */
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigprocmask(SIG_BLOCK, &term, &old);
  while (!done) sigsuspend(&old);
  return 0;
}
