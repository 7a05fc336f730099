"""`python -m spyglass run` (memory mode: the program in a child interpreter)
passes signals on as `spyglass run` does: a signal sent to a whole process
group (`kill -SIG -PGID` of a setsid run, Ctrl-C on a terminal) reaches the
program once, and a program killed by a signal kills the wrapper by the same
signal (a shell sees 130 for Ctrl-C, Python -2), not exit 128+N.

The program takes its signals with sigwaitinfo and logs each; SIGRTMIN
queues each sending, so a second delivery always shows. SIGRTMIN+1 sent to
the wrapper's pid goes through it after anything it still had to pass on."""
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

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


def wait_for(pred, what, drain=None, timeout=60):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if drain is not None:
      drain(0.02)
    value = pred()
    if value:
      return value
    time.sleep(0.02)
  pytest.fail("timed out waiting for " + what)


def lines(path):
  try:
    with open(path) as f:
      return f.read().split()
  except FileNotFoundError:
    return []


def pid_in(path):
  try:
    with open(path) as f:
      return int(f.read())
  except (FileNotFoundError, ValueError):
    return None


def counts(path):
  got = lines(path)
  return {name: got.count(name) for name in set(got)}


def through_wrapper(wrapper, log):
  before = lines(log).count("RT1")
  os.kill(wrapper, signal.SIGRTMIN + 1)
  wait_for(lambda: lines(log).count("RT1") > before, "SIGRTMIN+1 through the wrapper")


def run_argv(tmp_path, script, *args):
  path = tmp_path / "program.py"
  path.write_text(script)
  return [sys.executable, "-m", "spyglass", "run", "-o", str(tmp_path / "out"), str(path), *args]


def test_a_group_kill_of_a_setsid_run_reaches_the_program_once(tmp_path):
  log, ready = str(tmp_path / "log"), str(tmp_path / "ready")
  p = subprocess.Popen(run_argv(tmp_path, COUNTING, log, ready), start_new_session=True,
                       stderr=subprocess.PIPE, text=True)
  try:
    wait_for(lambda: pid_in(ready), "the program to start")
    for sig, name in ((signal.SIGINT, "INT"), (signal.SIGRTMIN, "RT")):
      os.killpg(p.pid, sig)
      wait_for(lambda: name in lines(log) or p.poll() is not None, f"kill -{name} of the group")
      assert p.poll() is None, f"kill -{name} of the group ended the wrapper ({p.returncode})"
    through_wrapper(p.pid, log)
    os.killpg(p.pid, signal.SIGTERM)
    _, err = p.communicate(timeout=60)
  finally:
    if p.poll() is None:
      p.kill()
  assert counts(log) == {"INT": 1, "RT": 1, "RT1": 1, "TERM": 1}, lines(log)
  assert p.returncode == 0, err[-2000:]


class Terminal:
  """A command on a pseudo-terminal (its session leader, as a login shell)."""

  def __init__(self, argv):
    self.printed = []
    self.pid, self.fd = pty.fork()
    if self.pid == 0:
      try:
        os.execv(argv[0], argv)
      finally:
        os._exit(127)

  def drain(self, wait):
    while select.select([self.fd], [], [], wait)[0]:
      try:
        data = os.read(self.fd, 4096)
      except OSError:
        return
      if not data:
        return
      self.printed.append(data)
      wait = 0

  def wait(self):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
      self.drain(0.02)
      done, status = os.waitpid(self.pid, os.WNOHANG)
      if done:
        return status
    pytest.fail("the run on a terminal did not end: " + repr(b"".join(self.printed)[-2000:]))

  def close(self):
    try:
      os.kill(self.pid, signal.SIGKILL)
      os.waitpid(self.pid, 0)
    except (ProcessLookupError, ChildProcessError):
      pass
    os.close(self.fd)


def test_ctrl_c_on_a_terminal_reaches_the_program_once(tmp_path):
  log, ready = str(tmp_path / "log"), str(tmp_path / "ready")
  term = Terminal(run_argv(tmp_path, COUNTING, log, ready))
  try:
    wait_for(lambda: pid_in(ready), "the program to start", term.drain)
    os.write(term.fd, b"\x03")  # Ctrl-C
    wait_for(lambda: "INT" in lines(log), "Ctrl-C to reach the program", term.drain)
    through_wrapper(term.pid, log)
    os.kill(term.pid, signal.SIGTERM)
    status = term.wait()
  finally:
    term.close()
  assert counts(log) == {"INT": 1, "RT1": 1, "TERM": 1}, (lines(log), b"".join(term.printed)[-2000:])
  assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_a_death_by_ctrl_c_is_the_wrappers(tmp_path):
  ready = str(tmp_path / "ready")
  term = Terminal(run_argv(tmp_path, SLEEPING, ready))
  try:
    wait_for(lambda: pid_in(ready), "the program to start", term.drain)
    os.write(term.fd, b"\x03")  # Python's KeyboardInterrupt, uncaught: a death by SIGINT
    status = term.wait()
  finally:
    term.close()
  assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT, (
      status, b"".join(term.printed)[-2000:])
  assert b"memory." in b"".join(term.printed)  # the summary came first
