#!/usr/bin/env python3
"""Memory profiling of an unmodified Python program (BENCHMARKS.md, "Python
programs"): bench/python_heap_workload.py run plain, under `spyglass run`
(Python frames interleaved with native ones, every allocation of Python's
three allocator domains and of malloc), and under memray with and without
native frames and Python-allocator tracing, in alternating rounds (a shared
VM drifts: each round runs every configuration once). Not a test.

  python_heap_bench.py --cli build/spyglass [--before-cli OTHER/spyglass] [--python PY] [--rounds N]
                       [--work-rounds R]

CPU is user+sys of the command and its children (wait4); wall is elapsed.
Slowdowns are against the same round's plain run (medians over rounds).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "python_heap_workload.py")


def run_once(cmd, env):
  t0 = time.perf_counter()
  p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  err = p.stderr.read()
  _, status, ru = os.wait4(p.pid, 0)
  wall = time.perf_counter() - t0
  p.stderr.close()
  if os.waitstatus_to_exitcode(status) != 0:
    raise SystemExit(f"{' '.join(cmd)} failed:\n{err.decode(errors='replace')[-2000:]}")
  return wall, ru.ru_utime + ru.ru_stime


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--cli", required=True, help="the spyglass CLI (build/spyglass)")
  ap.add_argument("--before-cli", help="another build's CLI, run the same way (before/after)")
  ap.add_argument("--python", default=sys.executable, help="the interpreter (memray must be installed in it)")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--work-rounds", type=int, default=3, help="the workload's rounds of 100k records")
  a = ap.parse_args()
  tmp = tempfile.mkdtemp(prefix="sg-pyheap-bench-")
  env = {k: v for k, v in os.environ.items()
         if not k.startswith("SPYGLASS_") and k not in ("LD_PRELOAD", "PYTHONMALLOC")}
  work = [WORKLOAD, str(a.work_rounds)]
  mr = [a.python, "-m", "memray", "run", "-q", "-f", "-o", os.path.join(tmp, "m.bin")]
  sg = [a.cli, "run", "-o", os.path.join(tmp, "sg"), "--"]
  configs = [
      ("plain", [a.python] + work),
      ("plain, PYTHONMALLOC=malloc", ["env", "PYTHONMALLOC=malloc", a.python] + work),
      ("spyglass run (Python + native frames, every allocation)", sg + [a.python] + work),
      ("spyglass run --python-allocator=malloc", sg[:2] + ["--python-allocator", "malloc"] + sg[2:] + [a.python] + work),
      ("spyglass run, frames through the public C API (SPYGLASS_PYTHON_FRAME_WALK=api)",
       ["env", "SPYGLASS_PYTHON_FRAME_WALK=api"] + sg + [a.python] + work),
      ("memray run (Python frames, malloc-level only)", mr + work),
      ("memray run --trace-python-allocators", mr[:4] + ["--trace-python-allocators"] + mr[4:] + work),
      ("memray run --native", mr[:4] + ["--native"] + mr[4:] + work),
      ("memray run --native --trace-python-allocators",
       mr[:4] + ["--native", "--trace-python-allocators"] + mr[4:] + work),
  ]
  if a.before_cli:
    # Its own libraries, wherever its build's RUNPATH points (a copy set aside stays what it was).
    configs.insert(2, ("spyglass run, before (--before-cli)",
                       ["env", "LD_LIBRARY_PATH=" + os.path.dirname(os.path.abspath(a.before_cli)), a.before_cli, "run",
                        "-o", os.path.join(tmp, "before"), "--", a.python] + work))
  walls = {name: [] for name, _ in configs}
  cpus = {name: [] for name, _ in configs}
  for _ in range(a.rounds):
    for name, cmd in configs:
      w, c = run_once(cmd, env)
      walls[name].append(w)
      cpus[name].append(c)
  ver = subprocess.run([a.python, "-c", "import sys, memray; print(sys.version.split()[0], memray.__version__)"],
                       capture_output=True, text=True, check=True).stdout.split()
  print(f"Python {ver[0]}, memray {ver[1]}, {a.rounds} rounds, workload rounds {a.work_rounds}")
  print("| configuration | wall (median) | CPU (median) | slowdown (CPU) | slowdown (wall) |")
  print("|---|---|---|---|---|")
  for name, _ in configs:
    rc = statistics.median(c / p for c, p in zip(cpus[name], cpus["plain"]))
    rw = statistics.median(w / p for w, p in zip(walls[name], walls["plain"]))
    print(f"| {name} | {statistics.median(walls[name]):.2f} s | {statistics.median(cpus[name]):.2f} s | "
          f"{rc:.2f}x | {rw:.2f}x |")


if __name__ == "__main__":
  main()
