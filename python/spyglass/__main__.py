"""python -m spyglass run [options] script.py [args...]   (or: -m module [args...])

Runs a Python program, unmodified, with Spyglass's heap hook: without --trace
(memory, the default) it writes memory profiles (pprof) whose stacks hold the
Python frames (function, file, line) interleaved with the native ones, for
Python's own allocators and native extensions' mallocs alike; see README.md,
"Memory profiles of Python programs". The same as `spyglass run -- python3
script.py` for a program that has no CLI at hand.
"""
import argparse
import os
import signal
import subprocess
import sys

PKG = os.path.dirname(os.path.abspath(__file__))


def memory_env(out_dir, python_allocator="pymalloc", sample_bytes=0, env=None):
  """The environment that runs a Python program under the heap hook shipped
  in this package (what `spyglass run` sets up): LD_PRELOAD, the profile
  directory, and the startup module that turns on Python frames."""
  env = dict(os.environ if env is None else env)
  hook = os.path.join(PKG, "libspyglass_heap.so")
  startup = os.path.join(PKG, "spyglass_python_startup")
  if not os.path.exists(hook) or not os.path.exists(os.path.join(startup, "sitecustomize.py")):
    raise FileNotFoundError(f"spyglass: this package has no heap hook ({hook}); reinstall it")
  env["LD_PRELOAD"] = hook + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
  env["SPYGLASS_HEAP"] = "1"
  env["SPYGLASS_HEAP_PROFILE_DIR"] = os.path.abspath(out_dir)
  env["PYTHONPATH"] = startup + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  if sample_bytes:
    env["SPYGLASS_HEAP_SAMPLE_BYTES"] = str(sample_bytes)
  if python_allocator == "malloc":
    env["PYTHONMALLOC"] = "malloc"
  return env


def run(argv):
  ap = argparse.ArgumentParser(prog="python -m spyglass run",
                               description="Run a Python program with memory profiling (Python and native frames).")
  ap.add_argument("-o", "--out", default=".", help="where memory.<pid>.exit.prof (and one per SIGUSR2) go")
  ap.add_argument("--python-allocator", choices=["pymalloc", "malloc"], default="pymalloc",
                  help="'malloc' sets PYTHONMALLOC=malloc: every object a malloc block (slower, more memory; "
                  "the profile is the heap as malloc sees it). Default: pymalloc, recorded as Python allocates")
  ap.add_argument("--sample-bytes", type=int, default=0,
                  help="sample one allocation per N bytes on average (0 = every allocation)")
  ap.add_argument("-m", dest="module", help="run a module (as python -m)")
  ap.add_argument("program", nargs=argparse.REMAINDER, help="script.py [args...] (or the module's args with -m)")
  a = ap.parse_args(argv)
  if a.program and a.program[0] == "--":
    a.program = a.program[1:]
  if not a.module and not a.program:
    ap.error("no script given")
  if not 0 <= a.sample_bytes <= (1 << 30):
    ap.error("--sample-bytes must be from 0 to 1073741824")
  os.makedirs(a.out, exist_ok=True)
  try:
    env = memory_env(a.out, a.python_allocator, a.sample_bytes)
  except FileNotFoundError as e:
    print(e, file=sys.stderr)
    return 2
  cmd = [sys.executable] + (["-m", a.module] if a.module else []) + a.program
  child = subprocess.Popen(cmd, env=env)
  for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2):
    signal.signal(sig, lambda s, _f: child.send_signal(s))  # SIGUSR2: a snapshot now
  code = child.wait()
  prefix = f"memory.{child.pid}."
  files = sorted(os.path.join(os.path.abspath(a.out), f) for f in os.listdir(a.out) if f.startswith(prefix))
  if files:
    print("spyglass run: memory snapshots:\n" + "".join(f"  {f}\n" for f in files) +
          f"Read them with: go tool pprof -top {files[-1]}", file=sys.stderr)
  else:
    print("spyglass run: no memory snapshot was written (did the program exit through os._exit or a signal?)",
          file=sys.stderr)
  return code if code >= 0 else 128 - code


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if not argv or argv[0] != "run":
    print(__doc__.strip(), file=sys.stderr)
    return 2
  return run(argv[1:])


if __name__ == "__main__":
  sys.exit(main())
