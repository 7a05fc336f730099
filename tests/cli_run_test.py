"""`spyglass run` leaves the program its own: its arguments.

  cli_run_test.py CASE SPYGLASS_CLI
    args     Debian programs (sort -r, head -n 1, ls -la, sort -o) print the
             same under `spyglass run`, with and without `--`
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


def main():
  case, cli = sys.argv[1], os.path.abspath(sys.argv[2])
  child = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else None
  {"args": args_case}[case](cli, child)


if __name__ == "__main__":
  main()
