"""`spyglass run` and process groups: a signal sent to a whole group reaches
the program once, as it would without spyglass, and the program's death by a
signal is the wrapper's.

  cli_run_jobs_test.py SPYGLASS_CLI RUN_SIGNAL_CHILD

    group_kill_of_its_session  started with setsid (it leads its group, no
        terminal): `kill -SIG -PGID` of that group reaches the program once
    under_timeout  `timeout` signals its child and then its whole group: the
        program gets what it gets without spyglass (two SIGRTMIN, one SIGTERM)
    shell_job  an interactive bash on a pseudo-terminal, with job control:
        `kill %1` of a background job reaches the program once; after `fg`,
        Ctrl-C reaches it once; Ctrl-Z stops the job and `fg` continues it;
        Ctrl-C kills `spyglass run sleep 60` and the shell sees 130

The program (tests/run_signal_child.c) logs each delivery; SIGRTMIN queues
each sending, so a second delivery always shows. Before each count is read,
SIGRTMIN+1 sent to the wrapper's pid goes through it after anything it still
had to pass on (real-time signals are taken in order).
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from cli_run_test import fail, no_core
from run_signal_util import (Terminal, child_pid, counts, read_lines, signal_its_group, through_wrapper,
                             wait_for)


def proc_stat(pid):
  """(state, ppid, pgrp, tpgid) of a process, or None when it is gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      rest = f.read().rsplit(")", 1)[1].split()
  except (OSError, IndexError):
    return None
  return rest[0], int(rest[1]), int(rest[2]), int(rest[5])


def expect(log, want, what):
  if counts(log) != want:
    fail(f"{what}: the program got {read_lines(log)}, not {want}")


def group_kill_of_its_session(cli, child, tmp):
  log, ready = os.path.join(tmp, "session.log"), os.path.join(tmp, "session.ready")
  p = subprocess.Popen([cli, "run", "-o", tmp, child, log, ready], start_new_session=True,
                       stderr=subprocess.PIPE, text=True, preexec_fn=no_core)
  try:
    wait_for(lambda: child_pid(ready), "the program under spyglass run")
    signal_its_group(p, log)
    _, err = p.communicate(timeout=30)
  finally:
    if p.poll() is None:
      p.kill()
  expect(log, {"INT": 1, "RT": 1, "RT1": 1, "TERM": 1}, "signals to the group of `setsid spyglass run`")
  if p.returncode != 0:
    fail(f"the program exited 0; setsid spyglass run ended with {p.returncode}: {err[-400:]!r}")
  # A program without a handler, killed through the group: the wrapper dies by the same signal.
  p = subprocess.Popen([cli, "run", "-o", tmp, "sleep", "60"], start_new_session=True,
                       stderr=subprocess.DEVNULL, preexec_fn=no_core)
  wait_for(lambda: any(proc_stat(int(e)) and proc_stat(int(e))[1] == p.pid and _comm(e) == "sleep"
                       for e in os.listdir("/proc") if e.isdigit()), "sleep to start")
  os.killpg(p.pid, signal.SIGTERM)
  if p.wait(timeout=30) != -signal.SIGTERM:
    fail(f"sleep killed by a group SIGTERM; spyglass run ended with {p.returncode}, not -SIGTERM")
  print("PASS: a kill of the whole group of `setsid spyglass run` reaches the program once")


def _comm(pid):
  try:
    with open(f"/proc/{pid}/comm") as f:
      return f.read().strip()
  except OSError:
    return ""


def under_timeout(cli, child, tmp):
  """timeout's own handler (the one its timer runs) signals its child, then its
  group: the same sendings with and without spyglass in between."""
  if shutil.which("timeout") is None:
    print("skip: under_timeout: no timeout(1) here")
    return
  got = {}
  for label, prefix in (("bare", []), ("spyglass run", [cli, "run", "-o", tmp])):
    log, ready = os.path.join(tmp, f"timeout-{len(got)}.log"), os.path.join(tmp, f"timeout-{len(got)}.ready")
    p = subprocess.Popen(["timeout", "-s", "RTMIN", "300"] + prefix + [child, log, ready], start_new_session=True,
                         stderr=subprocess.PIPE, text=True, preexec_fn=no_core)
    try:
      program = wait_for(lambda: child_pid(ready), f"the program under timeout ({label})")
      wrapper = proc_stat(program)[1] if prefix else program
      os.kill(p.pid, signal.SIGRTMIN)  # what timeout does when its time is up
      wait_for(lambda: "RT" in read_lines(log), f"timeout's SIGRTMIN to reach the program ({label})")
      through_wrapper(wrapper, log)
      os.kill(program, signal.SIGTERM)
      _, err = p.communicate(timeout=30)
    finally:
      if p.poll() is None:
        p.kill()
    if p.returncode != 0:
      fail(f"timeout ... {label}: exit {p.returncode}: {err[-400:]!r}")
    got[label] = read_lines(log).count("RT")
  if got["spyglass run"] != got["bare"]:
    fail(f"timeout's SIGRTMIN (to its child, then to its group): the program got it {got['spyglass run']} times "
         f"under spyglass run, {got['bare']} times without")
  # timeout -s TERM: once, and a death by it is passed up.
  log, ready = os.path.join(tmp, "timeout-term.log"), os.path.join(tmp, "timeout-term.ready")
  p = subprocess.Popen(["timeout", "-s", "TERM", "300", cli, "run", "-o", tmp, child, log, ready],
                       start_new_session=True, stderr=subprocess.DEVNULL, preexec_fn=no_core)
  wait_for(lambda: child_pid(ready), "the program under timeout -s TERM")
  os.kill(p.pid, signal.SIGTERM)
  if p.wait(timeout=30) != 0 or read_lines(log) != ["TERM"]:
    fail(f"timeout -s TERM: the program got {read_lines(log)}, not ['TERM']; exit {p.returncode}")
  print(f"PASS: under timeout the program gets timeout's signal as without spyglass ({got['bare']} SIGRTMIN, 1 SIGTERM)")


def shell_job(cli, child, tmp):
  if shutil.which("bash") is None:
    print("skip: shell_job: no bash here")
    return
  try:
    term = Terminal(["bash", "--norc", "--noprofile", "-i"], cwd=tmp,
                    env=dict(os.environ, PS1="$ ", TERM="dumb", HISTFILE="/dev/null"))
  except OSError as e:
    print(f"skip: shell_job: no pseudo-terminal here ({e})")
    return
  log, ready = os.path.join(tmp, "job.log"), os.path.join(tmp, "job.ready")

  def done(name):
    return os.path.exists(os.path.join(tmp, name))

  try:
    term.type(f"'{cli}' run -o '{tmp}' '{child}' '{log}' '{ready}' &\n")
    program = term.wait_for(lambda: child_pid(ready), "the background job's program")
    wrapper = proc_stat(program)[1]
    term.type("kill -s RTMIN %1; touch killed\n")
    term.wait_for(lambda: done("killed") and "RT" in read_lines(log), "kill %1 to reach the program")
    through_wrapper(wrapper, log)
    if read_lines(log).count("RT") != 1:
      fail(f"kill -s RTMIN %1 (the job's group): the program got {read_lines(log)}")

    def has_terminal():  # the program's group is the terminal's foreground group
      st = proc_stat(program)
      return st is not None and st[0] != "T" and st[3] == st[2]

    term.type("fg\n")
    term.wait_for(has_terminal, "fg to give the program the terminal")
    term.type("\x03")  # Ctrl-C
    term.wait_for(lambda: "INT" in read_lines(log), "Ctrl-C to reach the program")
    term.type("\x1a")  # Ctrl-Z
    term.wait_for(lambda: (proc_stat(program) or "?")[0] == "T" and (proc_stat(wrapper) or "?")[0] == "T",
                  "Ctrl-Z to stop the program and spyglass run")
    term.type("fg\n")
    term.wait_for(has_terminal, "fg to continue the program with the terminal")
    through_wrapper(wrapper, log)
    os.kill(wrapper, signal.SIGTERM)
    term.wait_for(lambda: proc_stat(wrapper) is None or proc_stat(wrapper)[0] == "Z", "the job to end")
    term.type("echo $? > job.status\n")
    term.wait_for(lambda: done("job.status") and read_lines(os.path.join(tmp, "job.status")), "the job's status")
    expect(log, {"INT": 1, "RT": 1, "RT1": 2, "TERM": 1}, "a shell job")
    status = read_lines(os.path.join(tmp, "job.status"))
    if status != ["0"]:
      fail(f"the program exited 0; the shell saw {status}")
    # Ctrl-C kills a program without a handler: the shell sees the death by
    # SIGINT (and so drops the rest of that command line, as for any program).
    term.type(f"'{cli}' run -o '{tmp}' sleep 60; touch not-dropped\n")
    sleeping = term.wait_for(lambda: [int(e) for e in os.listdir("/proc") if e.isdigit() and _comm(e) == "sleep"
                                      and has_fg(int(e)) and proc_stat(proc_stat(int(e))[1])[1] == term.pid],
                             "sleep to run in the foreground")
    wrapper = proc_stat(sleeping[0])[1]
    term.type("\x03")
    term.wait_for(lambda: proc_stat(wrapper) is None or proc_stat(wrapper)[0] == "Z", "Ctrl-C to end the job")
    term.type("echo $? > sleep.status\n")
    term.wait_for(lambda: done("sleep.status") and read_lines(os.path.join(tmp, "sleep.status")), "sleep's status")
    status = read_lines(os.path.join(tmp, "sleep.status"))
    if status != [str(128 + signal.SIGINT)] or done("not-dropped"):
      fail(f"Ctrl-C killed sleep; the shell saw {status}, not {128 + signal.SIGINT}, "
           f"{'and' if done('not-dropped') else 'but'} went on with the command line")
  finally:
    term.close()
  print("PASS: a shell job: kill %1, Ctrl-C, Ctrl-Z and fg reach the program once; its death is the job's")


def has_fg(pid):
  st = proc_stat(pid)
  return st is not None and st[3] == st[2]


def main():
  cli, child = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
  tmp = tempfile.mkdtemp(prefix="sg-cli-run-jobs-")
  only = os.environ.get("CLI_RUN_TEST_ONLY")  # one part, by name
  for part in (group_kill_of_its_session, under_timeout, shell_job):
    if not only or part.__name__ == only:
      part(cli, child, tmp)
  shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  main()
