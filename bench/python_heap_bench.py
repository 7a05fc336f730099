#!/usr/bin/env python3
"""Memory profiling of unmodified Python programs (BENCHMARKS.md, "Python
programs"), two workloads side by side in one run:
  - json.tool: `python -m json.tool` on a generated JSON file (~26 MB by
    default: 130k records of dicts, lists and strings), output to /dev/null;
  - heap: bench/python_heap_workload.py (lists of small dicts).
Each is run plain, under memray's default mode (Python frames, malloc-level
blocks), memray --native --trace-python-allocators (every object and every
malloc, native frames interleaved: the same information as Spyglass's full
mode), `spyglass run` (full, the default) and `spyglass run --python-mode
light` (memray's default mode's information), in alternating rounds (a
shared VM drifts: each round runs every configuration once). Not a test.

  python_heap_bench.py --cli build/spyglass [--before-cli OTHER/spyglass] [--python PY] [--rounds N]
                       [--work-rounds R] [--json-mb MB] [--workloads json,heap] [--more]

--more adds the other memray modes, --python-allocator=malloc and the public
C API frame walk for the heap workload. CPU is user+sys of the command and
its children (wait4); wall is elapsed. Slowdowns are against the same round's
plain run (medians over rounds).
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


def make_json(path, mb):
  """A JSON file of about `mb` MB: records of dicts, lists, strings, numbers (seeded: the same file each run)."""
  import json
  import random
  rng = random.Random(1)
  n = int(mb * 1e6 / 200)
  recs = [{"id": i, "name": f"user{i}", "email": f"u{i}@example.com", "score": rng.random() * 100,
           "tags": [f"t{rng.randrange(50)}" for _ in range(4)], "active": i % 3 == 0,
           "address": {"city": f"City{i % 997}", "zip": f"{i % 99999:05d}"}} for i in range(n)]
  with open(path, "w") as f:
    json.dump(recs, f)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--cli", required=True, help="the spyglass CLI (build/spyglass)")
  ap.add_argument("--before-cli", help="another build's CLI, run the same way (before/after)")
  ap.add_argument("--python", default=sys.executable, help="the interpreter (memray must be installed in it)")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--work-rounds", type=int, default=3, help="the heap workload's rounds of 100k records")
  ap.add_argument("--json-mb", type=float, default=26, help="size of the generated JSON file for json.tool")
  ap.add_argument("--workloads", default="json,heap", help="which workloads (json, heap), comma-separated")
  ap.add_argument("--more", action="store_true", help="also the other memray modes and spyglass variants")
  a = ap.parse_args()
  tmp = tempfile.mkdtemp(prefix="sg-pyheap-bench-")
  env = {k: v for k, v in os.environ.items()
         if not k.startswith("SPYGLASS_") and k not in ("LD_PRELOAD", "PYTHONMALLOC")}
  workloads = []
  for w in a.workloads.split(","):
    if w == "json":
      big = os.path.join(tmp, "big.json")
      make_json(big, a.json_mb)
      workloads.append((f"json.tool, {os.path.getsize(big) / 1e6:.1f} MB", ["-m", "json.tool", big]))
    elif w == "heap":
      workloads.append((f"python_heap_workload.py {a.work_rounds}", [WORKLOAD, str(a.work_rounds)]))
    else:
      raise SystemExit(f"unknown workload {w!r}")
  mr = [a.python, "-m", "memray", "run", "-q", "-f", "-o", os.path.join(tmp, "m.bin")]
  sg = [a.cli, "run", "-o", os.path.join(tmp, "sg")]

  def configs_for(work):
    configs = [
        ("plain", [a.python] + work),
        ("memray run (default: Python frames, malloc-level blocks)", mr + work),
        ("**spyglass run --python-mode light** (Python frames, malloc-level blocks and arenas)",
         sg + ["--python-mode", "light", "--", a.python] + work),
        ("memray run --native --trace-python-allocators (every object, native frames interleaved)",
         mr[:4] + ["--native", "--trace-python-allocators"] + mr[4:] + work),
        ("**spyglass run** (full, the default: every object, native frames interleaved)",
         sg + ["--", a.python] + work),
    ]
    if a.more:
      configs += [
          ("plain, PYTHONMALLOC=malloc", ["env", "PYTHONMALLOC=malloc", a.python] + work),
          ("spyglass run --python-allocator=malloc", sg + ["--python-allocator", "malloc", "--", a.python] + work),
          ("spyglass run, frames through the public C API (SPYGLASS_PYTHON_FRAME_WALK=api)",
           ["env", "SPYGLASS_PYTHON_FRAME_WALK=api"] + sg + ["--", a.python] + work),
          ("memray run --trace-python-allocators", mr[:4] + ["--trace-python-allocators"] + mr[4:] + work),
          ("memray run --native", mr[:4] + ["--native"] + mr[4:] + work),
      ]
    if a.before_cli:
      # Its own libraries, wherever its build's RUNPATH points (a copy set aside stays what it was).
      configs.append(("spyglass run, before (--before-cli)",
                      ["env", "LD_LIBRARY_PATH=" + os.path.dirname(os.path.abspath(a.before_cli)), a.before_cli,
                       "run", "-o", os.path.join(tmp, "before"), "--", a.python] + work))
    return configs

  table = [(wname, configs_for(work)) for wname, work in workloads]
  walls = {(w, name): [] for w, configs in table for name, _ in configs}
  cpus = {(w, name): [] for w, configs in table for name, _ in configs}
  for _ in range(a.rounds):
    for w, configs in table:
      for name, cmd in configs:
        wall, cpu = run_once(cmd, env)
        walls[(w, name)].append(wall)
        cpus[(w, name)].append(cpu)
  ver = subprocess.run([a.python, "-c", "import sys, memray; print(sys.version.split()[0], memray.__version__)"],
                       capture_output=True, text=True, check=True).stdout.split()
  print(f"Python {ver[0]}, memray {ver[1]}, {a.rounds} rounds, load average at the end "
        f"{os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
  print("| workload | configuration | wall (median) | CPU (median) | slowdown (CPU) | slowdown (wall) |")
  print("|---|---|---|---|---|---|")
  for w, configs in table:
    for name, _ in configs:
      rc = statistics.median(c / p for c, p in zip(cpus[(w, name)], cpus[(w, "plain")]))
      rw = statistics.median(x / p for x, p in zip(walls[(w, name)], walls[(w, "plain")]))
      print(f"| {w} | {name} | {statistics.median(walls[(w, name)]):.2f} s | "
            f"{statistics.median(cpus[(w, name)]):.2f} s | {rc:.2f}x | {rw:.2f}x |")


if __name__ == "__main__":
  main()
