"""Helpers of the tests that signal `spyglass run` and `python -m spyglass run`
(cli_run_test.py, cli_run_jobs_test.py, python/test_run_signals.py): waiting
without timing assertions, the signal program's log, a command on a
pseudo-terminal."""
import os
import pty
import select
import signal
import time


def wait_for(pred, what, timeout=30, drain=None):
  """pred()'s first true value; AssertionError after `timeout` seconds."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if drain is not None:
      drain(0.02)
    v = pred()
    if v:
      return v
    time.sleep(0.02)
  raise AssertionError("timed out waiting for " + what)


def read_lines(path):
  try:
    with open(path) as f:
      return f.read().split()
  except FileNotFoundError:
    return []


def child_pid(ready):
  """The pid the program wrote to `ready`, once it has."""
  try:
    with open(ready) as f:
      return int(f.read())
  except (FileNotFoundError, ValueError):
    return None


def counts(log):
  lines = read_lines(log)
  return {name: lines.count(name) for name in sorted(set(lines))}


def through_wrapper(wrapper, log):
  """Waits until what the wrapper had to pass on has reached the program:
  SIGRTMIN+1 sent to the wrapper's pid goes through it after anything it
  still had to pass on (real-time signals are taken in order)."""
  before = read_lines(log).count("RT1")
  os.kill(wrapper, signal.SIGRTMIN + 1)
  wait_for(lambda: read_lines(log).count("RT1") > before, "SIGRTMIN+1 through the wrapper")


def signal_its_group(p, log):
  """`p` (a Popen of a wrapper started with setsid: it leads its group) gets
  SIGINT, then SIGRTMIN, then SIGTERM sent to its whole group; each, before
  the next, reached the program (SIGRTMIN+1 went through the wrapper before
  SIGTERM)."""
  for sig, name in ((signal.SIGINT, "INT"), (signal.SIGRTMIN, "RT")):
    os.killpg(p.pid, sig)
    wait_for(lambda: name in read_lines(log) or p.poll() is not None, f"kill -{name} of the group")
    assert p.poll() is None, f"kill -{name} of the group ended the wrapper ({p.returncode})"
  through_wrapper(p.pid, log)
  os.killpg(p.pid, signal.SIGTERM)


class Terminal:
  """A command on a pseudo-terminal, as its session leader (a login shell's
  place). What it prints is kept in `printed`."""

  def __init__(self, argv, env=None, cwd=None):
    self.printed = []
    self.reaped = False
    self.pid, self.fd = pty.fork()
    if self.pid == 0:
      try:
        if cwd is not None:
          os.chdir(cwd)
        os.execvpe(argv[0], argv, os.environ if env is None else env)
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

  def shown(self):
    return b"".join(self.printed)[-2000:]

  def type(self, text):
    os.write(self.fd, text.encode())

  def wait_for(self, pred, what, timeout=30):
    try:
      return wait_for(pred, what, timeout, drain=self.drain)
    except AssertionError as e:
      raise AssertionError(f"{e}; the terminal shows {self.shown()!r}") from None

  def wait(self, timeout=60):
    """The command's wait status, once it ended."""
    status = []

    def ended():
      pid, st = os.waitpid(self.pid, os.WNOHANG)
      if pid:
        status.append(st)
      return bool(pid)

    self.wait_for(ended, "the command on the terminal to end", timeout)
    self.reaped = True
    return status[0]

  def close(self):
    if not self.reaped:
      try:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
      except (ProcessLookupError, ChildProcessError):
        pass
    os.close(self.fd)
