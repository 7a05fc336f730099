"""`python -m spyglass run` (memory mode: the program in a child interpreter)
passes signals on as `spyglass run` does: a signal sent to a whole process
group (`kill -SIG -PGID` of a setsid run, Ctrl-C on a terminal) reaches the
program once, and a program killed by a signal kills the wrapper by the same
signal (a shell sees 130 for Ctrl-C, Python -2), not exit 128+N.

The program takes its signals with sigwaitinfo and logs each; SIGRTMIN
queues each sending, so a second delivery always shows. SIGRTMIN+1 sent to
the wrapper's pid goes through it after anything it still had to pass on."""
import os
import signal
import subprocess
import sys
import textwrap

# The helpers of the CLI's signal tests, beside this folder.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from run_signal_util import Terminal, child_pid, counts, read_lines, signal_its_group, through_wrapper, wait_for  # pylint: disable=g-import-not-at-top,wrong-import-position

COUNTING = textwrap.dedent("""
    import os, signal, sys
    log, ready = sys.argv[1], sys.argv[2]
    names = {signal.SIGINT: "INT", signal.SIGTERM: "TERM", signal.SIGRTMIN: "RT", signal.SIGRTMIN + 1: "RT1"}
    signal.pthread_sigmask(signal.SIG_BLOCK, set(names))
    with open(ready + ".tmp", "w") as f:
      f.write(str(os.getpid()))
    os.rename(ready + ".tmp", ready)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    while True:
      sig = signal.sigwaitinfo(set(names)).si_signo
      os.write(fd, (names[sig] + "\\n").encode())
      if sig == signal.SIGTERM:
        break
""")

SLEEPING = textwrap.dedent("""
    import os, sys, time
    with open(sys.argv[1], "w") as f:
      f.write(str(os.getpid()))
    time.sleep(120)
""")


def run_argv(tmp_path, script, *args):
  path = tmp_path / "program.py"
  path.write_text(script)
  return [sys.executable, "-m", "spyglass", "run", "-o", str(tmp_path / "out"), str(path), *args]


def test_a_group_kill_of_a_setsid_run_reaches_the_program_once(tmp_path):
  log, ready = str(tmp_path / "log"), str(tmp_path / "ready")
  p = subprocess.Popen(run_argv(tmp_path, COUNTING, log, ready), start_new_session=True,
                       stderr=subprocess.PIPE, text=True)
  try:
    wait_for(lambda: child_pid(ready), "the program to start", timeout=60)
    signal_its_group(p, log)
    _, err = p.communicate(timeout=60)
  finally:
    if p.poll() is None:
      p.kill()
  assert counts(log) == {"INT": 1, "RT": 1, "RT1": 1, "TERM": 1}, read_lines(log)
  assert p.returncode == 0, err[-2000:]


def test_ctrl_c_on_a_terminal_reaches_the_program_once(tmp_path):
  log, ready = str(tmp_path / "log"), str(tmp_path / "ready")
  term = Terminal(run_argv(tmp_path, COUNTING, log, ready))
  try:
    term.wait_for(lambda: child_pid(ready), "the program to start", timeout=60)
    os.write(term.fd, b"\x03")  # Ctrl-C
    term.wait_for(lambda: "INT" in read_lines(log), "Ctrl-C to reach the program")
    through_wrapper(term.pid, log)
    os.kill(term.pid, signal.SIGTERM)
    status = term.wait()
  finally:
    term.close()
  assert counts(log) == {"INT": 1, "RT1": 1, "TERM": 1}, (read_lines(log), term.shown())
  assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_a_death_by_ctrl_c_is_the_wrappers(tmp_path):
  ready = str(tmp_path / "ready")
  term = Terminal(run_argv(tmp_path, SLEEPING, ready))
  try:
    term.wait_for(lambda: child_pid(ready), "the program to start", timeout=60)
    os.write(term.fd, b"\x03")  # Python's KeyboardInterrupt, uncaught: a death by SIGINT
    status = term.wait()
  finally:
    term.close()
  assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT, (
      status, term.shown())
  assert b"memory." in b"".join(term.printed)  # the summary came first
