"""`spyglass run` leaves the program its own: its arguments, its signals, its
exit; and the CLI's usage errors exit 2 with a message that names the flag.

  cli_run_test.py CASE SPYGLASS_CLI RUN_SIGNAL_CHILD [ENV_PROGRAM]
    args     Debian programs (sort -r, head -n 1, ls -la, sort -o) print the
             same under `spyglass run`, with and without `--`
    usage    usage errors exit 2; --flight-recorder 0 names the flag; a
             missing program is one message and 127; no command is usage and 2
    signals  SIGUSR1, SIGQUIT, SIGHUP, SIGINT, SIGTERM sent to the wrapper's pid
             reach the program once; Ctrl-C on a terminal reaches it once; a
             program killed by a signal kills the wrapper by the same signal;
             with ENV_PROGRAM (tests/env), kill -USR1 of the wrapper dumps the
             program's flight recorder
"""
import os
import pty
import queue
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from run_signal_util import child_pid, read_lines, wait_for


def fail(msg):
  print("FAIL: " + msg, file=sys.stderr)
  sys.exit(1)


def no_core():
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run(cmd, **kw):
  return subprocess.run(cmd, capture_output=True, text=True, timeout=60, preexec_fn=no_core, **kw)


def args_case(cli, _child):
  tmp = tempfile.mkdtemp(prefix="sg-run-args-")
  out = tempfile.mkdtemp(prefix="sg-run-args-out-")  # the profiles, away from what ls lists
  f = os.path.join(tmp, "f")
  with open(f, "w") as w:
    w.write("b\na\nc\n")
  listed = os.path.join(tmp, "in", "listed")
  os.makedirs(listed)
  for name in ("x", ".hidden"):
    open(os.path.join(listed, name), "w").close()
  programs = [["sort", "-r", f], ["head", "-n", "1", f], ["ls", "-la", listed]]
  for prog in programs:
    want = run(prog)
    if want.returncode != 0 or not want.stdout:
      fail(f"{prog} alone: {want.returncode} {want.stderr}")
    for flags in (["-o", out], ["-o", out, "--"], ["--out=" + out, "--memory"], ["--memory", "-o", out, "--"]):
      got = run([cli, "run", *flags, *prog])
      if got.returncode != 0 or got.stdout != want.stdout:
        fail(f"spyglass run {flags} {prog}: exit {got.returncode}, printed {got.stdout!r}, "
             f"not {want.stdout!r}; stderr {got.stderr[-600:]!r}")
  # The program's -o is its own, even after run's -o.
  for sep in ([], ["--"]):
    sorted_to = os.path.join(tmp, "sorted" + str(len(sep)))
    got = run([cli, "run", "-o", out, *sep, "sort", "-o", sorted_to, f])
    if got.returncode != 0 or not os.path.exists(sorted_to) or open(sorted_to).read() != "a\nb\nc\n":
      fail(f"spyglass run -o {out} {sep} sort -o FILE: exit {got.returncode}: {got.stderr[-600:]}")
  print(f"PASS: {len(programs)} programs print the same under spyglass run, with and without --; sort -o")


def usage_case(cli, child):
  out = tempfile.mkdtemp(prefix="sg-run-usage-")
  usage_errors = [
      [],                                                       # no command
      ["--bogus"],
      ["nosuchcommand"],
      ["summary"],                                              # a required argument missing
      ["summary", "--top", "x", "f"],
      ["run"],                                                  # no program
      ["run", "--trace"],                                       # no value
      ["run", "--bogus", "true"],
      ["run", "--python-allocator", "bogus", "true"],
      ["run", "--width", "3", "true"],
      ["memtop", "--width", "3", "f"],
      ["diff", "--fail-above", "-1", "a", "b"],
      ["collect", "1", "500", "--flight-recorder"],             # a duration the ring does not take
  ]
  for args in usage_errors:
    r = run([cli, *args], cwd=out)
    if r.returncode != 2 or not r.stderr.strip():
      fail(f"spyglass {args}: exit {r.returncode} (a usage error is 2), stderr {r.stderr[-400:]!r}")
  r = run([cli])
  if "run" not in r.stderr or "summary" not in r.stderr:
    fail(f"spyglass alone does not print its usage: {r.stderr!r}")
  for args in (["--help"], ["--version"], ["run", "--help"]):
    r = run([cli, *args])
    if r.returncode != 0 or not r.stdout:
      fail(f"spyglass {args}: exit {r.returncode}")
  if "PROGRAM" not in run([cli, "run", "--help"]).stdout:
    fail("spyglass run --help does not say where the program goes")
  # A bad setting is named by its flag, not by the environment variable behind it.
  for flag, value in (("--flight-recorder", "0"), ("--server", "abc"), ("--options", "bogus")):
    r = run([cli, "run", "-o", out, flag, value, child, "exit", "0"])
    if r.returncode != 2 or flag not in r.stderr or "SPYGLASS_" in r.stderr or len(r.stderr.splitlines()) != 1:
      fail(f"spyglass run {flag} {value}: exit {r.returncode}, {r.stderr!r}")
  # A program that is not there: the one message, a shell's 127, nothing run.
  r = run([cli, "run", "-o", out, "no-such-program-sg"])
  lines = r.stderr.splitlines()
  if r.returncode != 127 or len(lines) != 1 or "cannot run no-such-program-sg" not in lines[0]:
    fail(f"spyglass run no-such-program: exit {r.returncode}, {r.stderr!r}")
  r = run([cli, "run", "-o", out, "/dev/null"])
  if r.returncode != 126 or len(r.stderr.splitlines()) != 1:
    fail(f"spyglass run /dev/null: exit {r.returncode} (126: not runnable), {r.stderr!r}")
  r = run([cli, "run", "-o", out, child, "exit", "3"])
  if r.returncode != 3:
    fail(f"the program's exit status 3 came back as {r.returncode}")
  print(f"PASS: {len(usage_errors)} usage errors exit 2; flags named; 127, 126 and 3 passed on")


def signals_by_pid(cli, child, tmp, out):
  """Sent to the wrapper's pid: each reaches the program, once."""
  log, ready = os.path.join(tmp, "by-pid.log"), os.path.join(tmp, "by-pid.ready")
  p = subprocess.Popen([cli, "run", "-o", out, child, log, ready], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, preexec_fn=no_core)
  try:
    wait_for(lambda: child_pid(ready), "the program under spyglass run")
    sent = []
    for sig in (signal.SIGUSR1, signal.SIGQUIT, signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
      p.send_signal(sig)
      sent.append(sig.name[3:])
      if sig != signal.SIGTERM:
        wait_for(lambda: len(read_lines(log)) >= len(sent) or p.poll() is not None, f"{sig.name} to reach the program")
        if p.poll() is not None:
          fail(f"{sig.name} sent to spyglass run ended it ({p.returncode}) instead of reaching the program")
    _, err = p.communicate(timeout=30)
  finally:
    if p.poll() is None:
      p.kill()
  if p.returncode != 0 or read_lines(log) != sent:
    fail(f"signals sent to the wrapper: the program got {read_lines(log)}, not {sent}; exit {p.returncode}; "
         f"{err[-400:]!r}")



def ctrl_c_on_a_terminal(cli, child, tmp, out):
  """The terminal signals the whole foreground group, the program included;
  the wrapper must not pass on a second one."""
  log, ready = os.path.join(tmp, "tty.log"), os.path.join(tmp, "tty.ready")
  try:
    pid, master = pty.fork()
  except OSError as e:
    print(f"skip: Ctrl-C on a terminal: no pseudo-terminal here ({e})")
    return
  if pid == 0:
    try:
      no_core()
      os.execv(cli, [cli, "run", "-o", out, child, log, ready])
    finally:
      os._exit(127)
  printed = []

  def drain(wait):
    while select.select([master], [], [], wait)[0]:
      try:
        data = os.read(master, 4096)
      except OSError:
        return
      if not data:
        return
      printed.append(data)
      wait = 0

  try:
    wait_for(lambda: child_pid(ready), "the program under spyglass run on a terminal", drain=drain)
    os.write(master, b"\x03")  # Ctrl-C
    wait_for(lambda: "INT" in read_lines(log), "Ctrl-C to reach the program", drain=drain)
    os.kill(pid, signal.SIGTERM)  # after any second SIGINT the wrapper would send
    deadline = time.monotonic() + 30
    while True:
      drain(0.02)
      done, status = os.waitpid(pid, os.WNOHANG)
      if done:
        break
      if time.monotonic() > deadline:
        fail("spyglass run on a terminal did not exit")
  finally:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    os.close(master)
  if read_lines(log) != ["INT", "TERM"]:
    fail(f"one Ctrl-C: the program got {read_lines(log)}, not ['INT', 'TERM'] "
         f"(terminal: {b''.join(printed)[-400:]!r})")
  if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
    fail(f"spyglass run on a terminal: status {status:#x}")



def deaths_by_signal(cli, child, tmp, out):
  """A program that dies by a signal: the wrapper dies by it too, after its summary."""
  r = run([cli, "run", "-o", out, child, "abort"])
  if r.returncode != -signal.SIGABRT:
    fail(f"the program aborted; spyglass run ended with {r.returncode}, not -SIGABRT: {r.stderr[-400:]!r}")
  if "memory." not in r.stderr:
    fail(f"spyglass run printed no summary before it died: {r.stderr[-400:]!r}")
  # One without a handler, stopped through the wrapper: the same.
  p = subprocess.Popen([cli, "run", "-o", out, "sleep", "60"], stderr=subprocess.DEVNULL, preexec_fn=no_core)

  def sleeping():  # the wrapper's child has exec'd sleep
    for entry in os.listdir("/proc"):
      try:
        with open(f"/proc/{entry}/stat") as f:
          comm_and_rest = f.read().rsplit(")", 1)
        if int(comm_and_rest[1].split()[1]) == p.pid and comm_and_rest[0].endswith("(sleep"):
          return True
      except (OSError, ValueError, IndexError):
        continue
    return False

  wait_for(sleeping, "sleep to start under spyglass run")
  p.terminate()
  if p.wait(timeout=30) != -signal.SIGTERM:
    fail(f"sleep ended by SIGTERM; spyglass run ended with {p.returncode}, not -SIGTERM")


def flight_recorder_dump(cli, _child, tmp, _out, program):
  """The flight recorder's documented trigger, `kill -USR1 <pid>`, sent to
  the pid of `spyglass run` (what a user sees): the program dumps and runs on."""
  logs = os.path.join(tmp, "fr")
  p = subprocess.Popen([cli, "run", "--flight-recorder", "5", "--options", "spyglass_dump_signal=SIGUSR1",
                        "--trace", logs, program, "60"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, preexec_fn=no_core)
  lines = queue.Queue()
  threading.Thread(target=lambda: [lines.put(l) for l in p.stderr], daemon=True).start()
  said = []

  def until(text):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
      try:
        said.append(lines.get(timeout=0.1))
      except queue.Empty:
        if p.poll() is not None:
          break
        continue
      if text in said[-1]:
        return
    p.kill()
    fail(f"no {text!r} from the program under spyglass run (exit {p.poll()}): {said!r}")

  try:
    if p.stdout.readline().strip() != "RUNNING":
      fail("the program did not start")
    until("flight recorder on")
    p.send_signal(signal.SIGUSR1)
    until("flight recorder dumped (")
    if p.poll() is not None:
      fail(f"SIGUSR1 ended spyglass run ({p.returncode})")
    # Stopped by SIGTERM through the wrapper (the program has no handler for it).
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=30)
  finally:
    if p.poll() is None:
      p.kill()
  if rc != -signal.SIGTERM:
    fail(f"the program under spyglass run ended with {rc}, not -SIGTERM: {said!r}")
  dumps = [d for d in os.listdir(os.path.join(logs, "plugins", "profile")) if not d.startswith(".")]
  if len(dumps) != 1:
    fail(f"expected one dump under {logs}/plugins/profile, found {dumps}")
  print("PASS: kill -USR1 <spyglass run> dumped the program's flight recorder; the program ran on")


def signals_case(cli, child, program=None):
  tmp = tempfile.mkdtemp(prefix="sg-run-signals-")
  out = os.path.join(tmp, "out")
  parts = [signals_by_pid, ctrl_c_on_a_terminal, deaths_by_signal]
  only = os.environ.get("CLI_RUN_TEST_ONLY")  # one part, by name
  for part in parts:
    if not only or part.__name__ == only:
      part(cli, child, tmp, out)
  if program and (not only or only == "flight_recorder_dump"):
    flight_recorder_dump(cli, child, tmp, out, program)
  print("PASS: signals to the wrapper reach the program once; Ctrl-C once; deaths by signal passed on")


def main():
  case, cli = sys.argv[1], os.path.abspath(sys.argv[2])
  child = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else None
  # Every temporary folder of the case goes under one, removed when it passed.
  tempfile.tempdir = tempfile.mkdtemp(prefix=f"sg-cli-run-{case}-")
  if case == "signals" and len(sys.argv) > 4:
    signals_case(cli, child, os.path.abspath(sys.argv[4]))
  else:
    {"args": args_case, "usage": usage_case, "signals": signals_case}[case](cli, child)
  shutil.rmtree(tempfile.tempdir, ignore_errors=True)


if __name__ == "__main__":
  main()
