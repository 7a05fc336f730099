"""`spyglass run` leaves the program its own: its arguments, its exit; and
the CLI's usage errors exit 2 with a message that names the flag.

  cli_run_test.py CASE SPYGLASS_CLI RUN_SIGNAL_CHILD
    args     Debian programs (sort -r, head -n 1, ls -la, sort -o) print the
             same under `spyglass run`, with and without `--`
    usage    usage errors exit 2; --flight-recorder 0 names the flag; a
             missing program is one message and 127; no command is usage and 2
"""
import os
import resource
import subprocess
import sys
import tempfile


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


def main():
  case, cli = sys.argv[1], os.path.abspath(sys.argv[2])
  child = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else None
  {"args": args_case, "usage": usage_case}[case](cli, child)


if __name__ == "__main__":
  main()
